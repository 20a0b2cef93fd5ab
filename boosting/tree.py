"""Tree and model data types, traversal and versioned model files."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

from boosting import BoostingError
from boosting._typing import FloatArray, IntArray
from boosting.losses import transform
from boosting.params import BoostParams

MODEL_FORMAT = "fedboost-model"
MODEL_VERSION = 1
ENSEMBLES = ("boosting", "forest")
"""How a model's trees combine: boosting adds margins and transforms them (sigmoid, softmax);
a forest's leaves hold class frequencies (or means) already divided by its number of trees, so
their sum is the prediction itself."""


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One node. Internal nodes name the party owning the split feature.

    In a federated model the active party does not know a passive party's feature or threshold:
    those nodes carry only ``record_id``, the key into the owner's lookup table.
    """

    id: int
    left: int = -1
    right: int = -1
    owner: str = ""
    feature: int = -1
    bin: int = -1
    threshold: float = math.nan
    missing_left: bool = False
    record_id: int = -1
    value: float = 0.0

    @property
    def is_leaf(self) -> bool:
        """True for leaves."""
        return self.left < 0


@dataclass(frozen=True, slots=True)
class Tree:
    """A tree whose nodes are stored parents-before-children (ids ascending)."""

    nodes: tuple[TreeNode, ...]
    output: int = 0
    """Which output (class) this tree adds to."""


def trees_to_arrays(trees: list[Tree] | tuple[Tree, ...]) -> dict[str, Any]:
    """Trees as a few flat arrays (and the owner names), for checkpoints: packing one array
    per field instead of a dataclass per node keeps a checkpoint after tree 500 fast."""
    nodes = [n for t in trees for n in t.nodes]
    owners = sorted({n.owner for n in nodes})
    return {
        "sizes": np.array([len(t.nodes) for t in trees], dtype=np.int64),
        "outputs": np.array([t.output for t in trees], dtype=np.int64),
        "ints": np.array([(n.id, n.left, n.right, n.feature, n.bin, n.record_id,
                           owners.index(n.owner)) for n in nodes], dtype=np.int64).reshape(-1, 7),
        "threshold": np.array([n.threshold for n in nodes], dtype=np.float64),
        "value": np.array([n.value for n in nodes], dtype=np.float64),
        "missing_left": np.array([n.missing_left for n in nodes], dtype=bool),
        "owners": owners}


def trees_from_arrays(packed: dict[str, Any]) -> list[Tree]:
    """The trees :func:`trees_to_arrays` packed."""
    trees, start = [], 0
    owners = list(packed["owners"])
    for size, output in zip(packed["sizes"].tolist(), packed["outputs"].tolist()):
        rows = range(start, start + size)
        trees.append(Tree(nodes=tuple(
            TreeNode(id=i, left=left, right=right, owner=owners[o], feature=f, bin=b,
                     threshold=_float(packed["threshold"][k]), missing_left=bool(
                         packed["missing_left"][k]), record_id=r, value=float(packed["value"][k]))
            for k, (i, left, right, f, b, r, o) in zip(rows, packed["ints"][start:start + size]
                                                        .tolist())), output=output))
        start += size
    return trees


def _float(value: Any) -> float:
    """NaN as ``math.nan`` itself (the node default), so unpacked trees equal the originals."""
    number = float(value)
    return math.nan if math.isnan(number) else number


Decide = Callable[[TreeNode, IntArray], np.ndarray]
"""Given an internal node and row indices reaching it, the mask of those rows going left."""


def leaf_values(tree: Tree, n_rows: int, decide: Decide) -> FloatArray:
    """Route all rows through ``tree`` with ``decide`` and return each row's leaf value."""
    position = np.zeros(n_rows, dtype=np.int64)
    for node in tree.nodes:
        if node.is_leaf:
            continue
        rows = np.flatnonzero(position == node.id)
        if rows.size == 0:
            continue
        left = decide(node, rows)
        position[rows[left]] = node.left
        position[rows[~left]] = node.right
    return node_values(tree)[position]


def node_values(tree: Tree) -> FloatArray:
    """Leaf value indexed by node id (0 for internal nodes)."""
    table = np.zeros(max(node.id for node in tree.nodes) + 1)
    for node in tree.nodes:
        table[node.id] = node.value
    return table


@dataclass(frozen=True, slots=True)
class Model:
    """A boosted ensemble as one party holds it."""

    params: BoostParams
    base_score: tuple[float, ...]
    n_classes: int
    trees: tuple[Tree, ...]
    features: dict[str, tuple[str, ...]]
    """Feature names per owner party, in each owner's local column order."""
    ensemble: str = "boosting"
    """One of :data:`ENSEMBLES`."""

    def raw_predict(self, decide: Decide, n_rows: int) -> FloatArray:
        """Margins (rows x outputs) given a decision function."""
        margin = np.tile(np.array(self.base_score), (n_rows, 1))
        for tree in self.trees:
            margin[:, tree.output] += leaf_values(tree, n_rows, decide)
        return margin

    def predict(self, decide: Decide, n_rows: int) -> FloatArray:
        """Probabilities (classification) or values (regression), rows x outputs."""
        return self.finish(self.raw_predict(decide, n_rows))

    def finish(self, margin: FloatArray) -> FloatArray:
        """Predictions from summed leaf values (what :meth:`raw_predict` returns)."""
        return finish_margin(self.ensemble, self.params.objective, margin)


def finish_margin(ensemble: str, objective: str, margin: FloatArray) -> FloatArray:
    """Boosting: the objective's transform of the margin. Forest: the sum of the trees'
    pre-divided leaf values is already the averaged probability (or mean)."""
    if ensemble == "forest":
        return margin
    return transform(objective, margin)


def raw_decider(columns: dict[str, FloatArray]) -> Decide:
    """Decide on raw values with the thresholds stored in the nodes (owner -> matrix)."""

    def decide(node: TreeNode, rows: IntArray) -> np.ndarray:
        values = columns[node.owner][rows, node.feature]
        missing = np.isnan(values)
        with np.errstate(invalid="ignore"):
            return np.where(missing, node.missing_left, values <= node.threshold)

    return decide


def model_to_dict(model: Model) -> dict[str, Any]:
    """Versioned, JSON-ready form of a model."""
    return {
        "format": MODEL_FORMAT,
        "version": MODEL_VERSION,
        "params": model.params.to_dict(),
        "base_score": list(model.base_score),
        "n_classes": model.n_classes,
        "ensemble": model.ensemble,
        "features": {k: list(v) for k, v in model.features.items()},
        "trees": [
            {"output": t.output, "nodes": [_node_to_dict(n) for n in t.nodes]} for t in model.trees
        ],
    }


def _node_to_dict(node: TreeNode) -> dict[str, Any]:
    raw = dataclasses.asdict(node)
    raw["threshold"] = None if math.isnan(node.threshold) else node.threshold
    return raw


def model_from_dict(raw: dict[str, Any]) -> Model:
    """Inverse of :func:`model_to_dict`, checking format and version."""
    if raw.get("format") != MODEL_FORMAT or raw.get("version") != MODEL_VERSION:
        raise BoostingError(
            f"not a {MODEL_FORMAT} v{MODEL_VERSION} file "
            f"(format={raw.get('format')!r}, version={raw.get('version')!r})"
        )
    trees = []
    for t in raw["trees"]:
        nodes = []
        for n in t["nodes"]:
            fields = dict(n)
            fields["threshold"] = math.nan if fields["threshold"] is None else fields["threshold"]
            nodes.append(TreeNode(**fields))
        trees.append(Tree(nodes=tuple(nodes), output=int(t["output"])))
    return Model(
        params=BoostParams.from_dict(raw["params"]),
        base_score=tuple(float(x) for x in raw["base_score"]),
        n_classes=int(raw["n_classes"]),
        trees=tuple(trees),
        features={k: tuple(v) for k, v in raw["features"].items()},
        ensemble=_ensemble(raw.get("ensemble", "boosting")),  # files before forests: boosting
    )


def _ensemble(value: Any) -> str:
    if value not in ENSEMBLES:
        raise BoostingError(f"unknown ensemble {value!r}: one of {', '.join(ENSEMBLES)}")
    return str(value)


def save_model(model: Model, path: Path) -> None:
    """Write a model file atomically."""
    write_json_atomic(path, model_to_dict(model))


def load_model(path: Path) -> Model:
    """Read a model file written by :func:`save_model`."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BoostingError(f"cannot read model file {path}: {exc}") from exc
    return model_from_dict(raw)


def write_json_atomic(path: Path, payload: Any, permissions: int = 0o600) -> None:
    """Write JSON so that readers never see half a file; the party's alone unless
    ``permissions`` say otherwise (see ``open_private``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_private(path, permissions=permissions) as handle:
        handle.write(json.dumps(payload, indent=1, sort_keys=True))


@contextmanager
def open_private(path: Path, mode: Literal["w", "wb"] = "w", *, permissions: int = 0o600,
                 replace: bool = True) -> Iterator[IO[Any]]:
    """Write ``path`` whole or not at all, readable and writable by its owner only (0600)
    whatever the umask, and never through a symbolic link: model parts, lookup tables,
    checkpoints, keys and scores are the party's own.

    The content goes to a new file under a random name beside ``path``, created with
    ``O_EXCL | O_NOFOLLOW``: a link planted under that name (issue 28: the old names were
    ``path`` + ``.tmp``) is refused, never followed or truncated. The file is synced and then
    renamed over ``path``; a rename replaces a link at ``path`` itself, never the file it points
    to. With ``replace=False`` an existing ``path`` is kept (FileExistsError).

    Raises
    ------
    FileExistsError
        The temporary name is taken (someone put a file or link there), or ``path`` exists and
        ``replace`` is false.
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "refusing to write a private file through a name "
                              "that exists already (a planted link?)", str(tmp)) from None
    try:
        os.fchmod(fd, permissions)  # the umask narrows the mode given to open, not this
        handle: IO[Any] = (os.fdopen(fd, "w", newline="") if mode == "w"
                           else os.fdopen(fd, "wb"))
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path, follow_symlinks=False)
    finally:
        tmp.unlink(missing_ok=True)  # written elsewhere, or failed half-way
