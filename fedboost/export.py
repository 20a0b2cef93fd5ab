"""Export a model a party holds whole to XGBoost's JSON model format (``save_model`` of a
``.json`` file), which SHAP's TreeExplainer, treelite, ONNX converters and serving stacks read.

A party holds a model whole when it knows every split's feature and threshold: a horizontal
or SimFL member (every member keeps the shared model), or a vertical protocol's active party
when no split is a passive party's (its lookup table keeps those; Completely SecureBoost keeps
only the first round to the active party, so a vertical model is whole only when the
passive parties won no split at all, e.g. ``n_trees: 1`` with ``complete_secure``).

How fedboost's model maps onto XGBoost's:

- **Decisions.** fedboost sends a row left when ``x <= threshold`` (float64); XGBoost when
  ``float32(x) < split_condition`` (a ``DMatrix`` holds float32). The exported condition is
  the float32 just above ``float32(threshold)``: rounding to float32 is monotone, so every row
  with ``x <= threshold`` goes left, and every row with ``x > threshold`` goes right unless
  ``float32(x) == float32(threshold)`` (values within 2^-24 relative of the threshold, which
  float32 cannot tell apart; no threshold fedboost cuts from data of fewer than 8 significant
  digits is that close to a value). A split of missing against present values (threshold
  +inf) becomes the largest float32. Missing values (NaN) take ``default_left``.
- **Boosting.** One tree per class per round (``tree_info`` is the class);
  ``binary:logistic``, ``multi:softprob`` or ``reg:squarederror``, with ``base_score`` the
  model's base margin through the objective's link (XGBoost stores it as a probability for
  logistic objectives).
- **Random forest.** XGBoost represents a forest as one boosting round of
  ``num_parallel_tree`` trees whose leaves it adds up (its forest trainer divides the
  learning rate by the number of trees). fedboost's forest leaves are already divided by the
  number of trees, so the trees go over as they are, in one round, under ``reg:squarederror``
  with base score 0: XGBoost's prediction is the forest's averaged probability of class 1
  (binary), mean (regression), or one column per class (multiclass, ``num_target`` classes).
- Node covers (``sum_hessian``) and gains (``loss_changes``) are 0: fedboost's model files do
  not keep them, so SHAP's path-dependent explainer needs background data (interventional).
- Categorical columns, which fedboost encodes as codes 0..n-1 (``categories.json`` beside the
  model), go over as those numeric codes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boosting import BoostingError
from boosting.tree import Model, Tree, load_model, write_json_atomic
from workers.model_folder import ModelPart, RunFolder

XGBOOST_JSON = "xgboost-json"
FORMATS = (XGBOOST_JSON,)
XGBOOST_VERSION = [2, 1, 0]
"""The format version written: what XGBoost 2.1 saves, and 2.1 and later load."""
_ROOT_PARENT = 2147483647
"""XGBoost's parent of the root node (int32 max)."""
_OBJECTIVES = {"binary": "binary:logistic", "multiclass": "multi:softprob",
               "regression": "reg:squarederror"}


class NotExportable(BoostingError):
    """The party does not hold the whole model (another party keeps some splits)."""


@dataclass(frozen=True, slots=True)
class Exported:
    """What :func:`export_model` wrote."""

    party: str
    out: Path
    n_trees: int
    features: tuple[str, ...]
    """The columns the exported model reads, in order (the DMatrix's columns)."""
    categorical: tuple[str, ...]
    """Of those, the columns fedboost encoded as category codes."""


def export_model(model_dir: Path, out: Path, *, fmt: str = XGBOOST_JSON,
                 party: str | None = None) -> Exported:
    """Write the model part of ``party`` (default: the active party, or the first member) in
    ``model_dir`` (a run folder holding ``job.json``, or one party's folder) as ``fmt``.

    Raises
    ------
    BoostingError
        An unknown format or a folder without the party's model.
    NotExportable
        The party does not hold every split of its model.
    """
    if fmt not in FORMATS:
        raise BoostingError(f"unknown export format {fmt!r}: one of {', '.join(FORMATS)}")
    folder, name = party_folder(model_dir, party)
    model = load_model(ModelPart(folder).model)
    owner = _owner(model, name)
    payload = to_xgboost_json(model, owner)
    write_json_atomic(out, payload, permissions=0o644)
    categorical = _categorical(folder)
    features = model.features[owner]
    return Exported(name, out, len(model.trees), features,
                    tuple(f for f in features if f in categorical))


def party_folder(model_dir: Path, party: str | None) -> tuple[Path, str]:
    """The folder holding ``party``'s ``model.json``, and the party's name."""
    if ModelPart(model_dir).party.is_file():  # one party's folder (a worker's models/JOB/P)
        name = str(_read(ModelPart(model_dir).party).get("party", ""))
        if party not in (None, name):
            raise BoostingError(f"{model_dir} holds party {name}'s model, not {party}'s")
        return model_dir, name
    if not RunFolder(model_dir).job.is_file():
        raise BoostingError(f"{model_dir}: not a fedboost model folder (no job.json or "
                            f"party.json)")
    parties: dict[str, Any] = _read(RunFolder(model_dir).job).get("parties", {})
    if party is None:
        holders = [p for p, entry in parties.items()
                   if isinstance(entry, dict) and entry.get("role") in ("active", "member")]
        if not holders:
            raise BoostingError(f"{model_dir}/job.json names no active party or member")
        party = holders[0]
    elif party not in parties:
        raise BoostingError(f"{model_dir}/job.json has no party {party!r} (parties: "
                            f"{', '.join(parties)})")
    folder = model_dir / party
    if not ModelPart(folder).model.is_file():
        raise NotExportable(f"party {party} holds no model.json in {folder} (a passive party "
                            f"keeps a lookup table; over a broker each worker keeps its part in "
                            f"its models folder: export models/JOB/PARTY there)")
    return folder, party


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BoostingError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise BoostingError(f"{path}: expected a JSON object")
    return raw


def _categorical(folder: Path) -> set[str]:
    """The party's features of text it coded (``workers.data.save_categories``)."""
    from workers.data import load_categories

    return set(load_categories(folder))


def _owner(model: Model, party: str) -> str:
    """The owner name the model's splits carry for ``party`` (horizontal and SimFL models
    name their shared columns' owner once for all members)."""
    owners = {n.owner for t in model.trees for n in t.nodes if not n.is_leaf}
    held = [o for o in model.features if model.features[o]]
    own = party if party in model.features else (held[0] if len(held) == 1 else party)
    others = owners - {own}
    if others:
        hidden = sum(1 for t in model.trees for n in t.nodes
                     if not n.is_leaf and n.owner != own)
        raise NotExportable(
            f"party {party} does not hold the whole model: {hidden} split(s) belong to "
            f"{', '.join(sorted(others))}, whose lookup tables alone know their features and "
            f"thresholds; such a model scores only federatedly (fedboost predict)")
    return own


def to_xgboost_json(model: Model, owner: str) -> dict[str, Any]:
    """XGBoost's JSON model of ``model``, whose every split is ``owner``'s."""
    names = list(model.features[owner])
    forest = model.ensemble == "forest"
    outputs = max(1, max((t.output for t in model.trees), default=0) + 1, len(model.base_score))
    trees = [_tree(t, k, len(names)) for k, t in enumerate(model.trees)]
    rounds = 1 if forest or not trees else math.ceil(len(trees) / outputs)
    indptr = ([0, len(trees)] if forest else
              [min(r * outputs, len(trees)) for r in range(rounds + 1)])
    objective = "reg:squarederror" if forest else _OBJECTIVES[model.params.objective]
    multiclass = objective == "multi:softprob"
    return {
        "version": XGBOOST_VERSION,
        "learner": {
            "attributes": {},
            "feature_names": names,
            "feature_types": ["float"] * len(names),
            "gradient_booster": {
                "name": "gbtree",
                "model": {
                    "gbtree_model_param": {
                        "num_parallel_tree": str(max(1, len(trees)) if forest else 1),
                        "num_trees": str(len(trees))},
                    "iteration_indptr": indptr,
                    "tree_info": [t.output for t in model.trees],
                    "trees": trees,
                },
            },
            "learner_model_param": {
                "base_score": _base_score(model, forest),
                "boost_from_average": "0",
                "num_class": str(outputs if multiclass else 0),
                "num_feature": str(len(names)),
                "num_target": str(outputs if forest and outputs > 1 else 1),
            },
            "objective": _objective(objective, outputs),
        },
    }


def _base_score(model: Model, forest: bool) -> str:
    """The base margin through the objective's link, as XGBoost stores it."""
    if forest:
        return "0"
    margin = float(model.base_score[0]) if model.base_score else 0.0
    if model.params.objective == "binary":
        return repr(1.0 / (1.0 + math.exp(-margin)))
    if model.params.objective == "multiclass":
        # softmax ignores a margin added to every class; fedboost's is 0
        if any(b != model.base_score[0] for b in model.base_score):
            raise BoostingError("a multiclass model with per-class base margins cannot be "
                                "exported (fedboost's are equal)")
        return "0.5"
    return repr(margin)


def _objective(name: str, outputs: int) -> dict[str, Any]:
    if name == "binary:logistic":
        return {"name": name, "reg_loss_param": {"scale_pos_weight": "1"}}
    if name == "multi:softprob":
        return {"name": name, "softmax_multiclass_param": {"num_class": str(outputs)}}
    return {"name": name, "reg_loss_param": {"scale_pos_weight": "1"}}


def split_condition(threshold: float) -> float:
    """XGBoost's float32 condition ``c`` such that ``float32(x) < c`` whenever ``x <=
    threshold``: the float32 just above ``float32(threshold)`` (module docstring)."""
    if math.isinf(threshold):
        return float(np.finfo(np.float32).max)
    below = np.float32(threshold)
    return float(np.nextafter(below, np.float32(np.inf), dtype=np.float32))


def _tree(tree: Tree, index: int, n_features: int) -> dict[str, Any]:
    """One tree as XGBoost's arrays, nodes numbered 0..n-1 in fedboost's (parents-first)
    order."""
    number = {node.id: k for k, node in enumerate(tree.nodes)}
    n = len(tree.nodes)
    left, right, parents = [-1] * n, [-1] * n, [_ROOT_PARENT] * n
    conditions, indices, default_left, weights = [0.0] * n, [0] * n, [0] * n, [0.0] * n
    for k, node in enumerate(tree.nodes):
        if node.is_leaf:
            conditions[k] = weights[k] = float(node.value)
            continue
        if not 0 <= node.feature < n_features or math.isnan(node.threshold):
            raise NotExportable(f"tree {index} node {node.id}: no feature or threshold")
        left[k], right[k] = number[node.left], number[node.right]
        parents[left[k]] = parents[right[k]] = k
        conditions[k] = split_condition(node.threshold)
        indices[k], default_left[k] = node.feature, int(node.missing_left)
    return {
        "id": index,
        "tree_param": {"num_deleted": "0", "num_feature": str(n_features),
                       "num_nodes": str(n), "size_leaf_vector": "1"},
        "left_children": left, "right_children": right, "parents": parents,
        "split_indices": indices, "split_conditions": conditions, "split_type": [0] * n,
        "default_left": default_left, "base_weights": weights,
        "loss_changes": [0.0] * n, "sum_hessian": [0.0] * n,
        "categories": [], "categories_nodes": [], "categories_segments": [],
        "categories_sizes": [],
    }
