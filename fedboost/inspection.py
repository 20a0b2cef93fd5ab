"""What a model folder holds, each party's part as that party can read it (``fedboost inspect``).

A folder is a run folder (one sub-folder per party, as ``fedboost train`` writes it), one
party's folder (``models/JOB/PARTY`` of a worker) or a centralized run. Each part shows its
format and version, ensemble and objective, its trees, and thresholds only where the part holds
them: the active party's model names a passive party's node ``party:record#k``, and that
party's lookup table lists record ``k``. Categorical features show the categories going left.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boosting import BoostingError
from boosting.tree import Model, Tree, TreeNode, load_model
from flows.config import ConfigError
from workers import DataError, ProtocolError
from workers.column_partitioned.lookup import LookupRecord, lookup_from_dict
from workers.data import load_categories
from workers.model_folder import PART_FILES, ModelPart, RunFolder


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the part's owner sees it."""

    id: int
    depth: int
    leaf: bool
    owner: str = ""
    """The party owning the split (internal nodes)."""
    feature: str | None = None
    """The split's feature, where this part holds it."""
    threshold: float | None = None
    """``x <= threshold`` goes left, where this part holds it."""
    missing_left: bool | None = None
    record: int | None = None
    """Another party's node: the record of its lookup table."""
    left_categories: list[str] | None = None
    """A categorical feature's categories that go left."""
    left: int = -1
    right: int = -1
    value: float | None = None
    """A leaf's value."""

    def text(self) -> str:
        """One line: the split or the leaf."""
        if self.leaf:
            return f"[{self.id}] leaf {self.value:.6g}"
        if self.feature is None:
            return f"[{self.id}] {self.owner}:record#{self.record}"
        missing = "missing left" if self.missing_left else "missing right"
        if self.left_categories is not None:
            split = f"{self.feature} in {{{', '.join(self.left_categories)}}}"
        else:
            split = f"{self.feature} <= {self.threshold:.6g}"
        return f"[{self.id}] {self.owner}: {split} ({missing})"


@dataclass(frozen=True, slots=True)
class TreeView:
    """One tree: the output (class) it adds to, its depth and nodes (parents first)."""

    index: int
    output: int
    depth: int
    leaves: int
    nodes: list[NodeView]

    def depth_first(self) -> list[NodeView]:
        """The nodes in reading order: each node, then its left and its right subtree."""
        by_id = {n.id: n for n in self.nodes}
        order: list[NodeView] = []
        stack = [self.nodes[0].id] if self.nodes else []
        while stack:
            node = by_id[stack.pop()]
            order.append(node)
            if not node.leaf:
                stack.extend((node.right, node.left))
        return order


@dataclass(frozen=True, slots=True)
class RecordView:
    """One record of a passive party's lookup table."""

    record: int
    feature: str
    threshold: float
    bin: int
    missing_left: bool
    left_categories: list[str] | None = None
    flip: bool = False
    """The forest showed the lender this split's children swapped: its "left" is the other
    side."""


@dataclass(frozen=True, slots=True)
class PartView:
    """One party's model part."""

    party: str
    role: str
    file: str
    format: str
    version: int
    job: str | None = None
    features: list[str] = field(default_factory=list)
    """The features this part holds (its own)."""
    categories: dict[str, int] = field(default_factory=dict)
    """Categorical features and their number of categories."""
    ensemble: str | None = None
    objective: str | None = None
    n_classes: int | None = None
    max_depth: int | None = None
    """The training parameter; each tree's own depth is in ``trees``."""
    base_score: list[float] | None = None
    n_trees: int = 0
    other_records: dict[str, int] = field(default_factory=dict)
    """A model's nodes owned by other parties: records referenced, per party."""
    lookup_size: int | None = None
    """A lookup table's records."""
    trees: list[TreeView] = field(default_factory=list)
    records: list[RecordView] = field(default_factory=list)

    def text(self) -> list[str]:
        """Lines describing the part."""
        head = f"{self.party} ({self.role}) {self.file}: {self.format} v{self.version}"
        if self.job:
            head += f", job {self.job}"
        lines = [head]
        if self.lookup_size is not None:
            lines.append(f"  lookup table: {self.lookup_size} records over "
                         f"{len(self.features)} features")
        else:
            lines.append(f"  ensemble {self.ensemble}, objective {self.objective}, "
                         f"{self.n_trees} trees (max_depth {self.max_depth}), "
                         f"{self.n_classes} classes, base score "
                         f"{', '.join(f'{b:.6g}' for b in self.base_score or [])}")
        lines.append(f"  features ({len(self.features)}): {', '.join(self.features)}")
        if self.categories:
            lines.append("  categorical: " + ", ".join(f"{k} ({n} categories)"
                                                       for k, n in self.categories.items()))
        if self.other_records:
            lines.append("  other parties' nodes (their lookup records): " + ", ".join(
                f"{p} {n}" for p, n in self.other_records.items()))
        for tree in self.trees:
            lines.append(f"  tree {tree.index} (output {tree.output}, depth {tree.depth}, "
                         f"{tree.leaves} leaves)")
            lines.extend("    " + "  " * n.depth + n.text() for n in tree.depth_first())
        for r in self.records:
            split = (f"{r.feature} in {{{', '.join(r.left_categories)}}}"
                     if r.left_categories is not None else f"{r.feature} <= {r.threshold:.6g}")
            lines.append(f"  record#{r.record}: {split} (bin {r.bin}, "
                         f"{'missing left' if r.missing_left else 'missing right'}"
                         f"{', children shown swapped' if r.flip else ''})")
        return lines


@dataclass(frozen=True, slots=True)
class ModelInspection:
    """Every readable part of a model folder."""

    model_dir: str
    parts: list[PartView]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``fedboost inspect --json`` prints."""
        return dataclasses.asdict(self)

    def text(self) -> str:
        """What ``fedboost inspect`` prints."""
        lines = [f"{self.model_dir}: {len(self.parts)} model part(s)"]
        for part in self.parts:
            lines.extend(part.text())
        return "\n".join(lines)


def inspect_model(model_dir: Path, party: str | None = None) -> ModelInspection:
    """The parts in ``model_dir`` (itself a part, or one folder per party); ``party`` keeps
    only that party's. A folder without parts is a ``ConfigError``."""
    folders = _part_folders(model_dir)
    if not folders:
        raise ConfigError(f"{model_dir}: no model part here ({' or '.join(PART_FILES)}, in the "
                          f"folder or in one folder per party)")
    parts = [_part(folder) for folder in folders]
    if party is not None:
        parts = [p for p in parts if p.party == party]
        if not parts:
            raise ConfigError(f"--party {party}: no part of that party in {model_dir} (parties: "
                              f"{', '.join(_part(f).party for f in folders)})")
    return ModelInspection(model_dir=str(model_dir), parts=parts)


def _part_folders(model_dir: Path) -> list[Path]:
    if ModelPart(model_dir).holds_a_part():
        return [model_dir]
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: not a folder")
    found = [d for d in sorted(model_dir.iterdir())
             if d.is_dir() and not d.name.startswith(".")
             and ModelPart(d).holds_a_part()]
    order = _job_parties(model_dir)  # the job file's order: the active party first
    return sorted(found, key=lambda d: (order.index(d.name) if d.name in order else len(order),
                                       d.name))


def _job_parties(model_dir: Path) -> list[str]:
    try:
        return list(json.loads(RunFolder(model_dir).job.read_text()).get("parties", {}))
    except (OSError, ValueError, AttributeError):
        return []


def _party_file(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads(ModelPart(folder).party.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _part(folder: Path) -> PartView:
    about = _party_file(folder)
    categories = _categories(folder)
    if ModelPart(folder).lookup.is_file():
        return _lookup_part(folder, about, categories)
    path = ModelPart(folder).model
    try:
        model = load_model(path)
        raw = json.loads(path.read_text())
    except (BoostingError, OSError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{path}: cannot read it as a model ({exc})") from None
    role = str(about.get("role", "centralized" if not about else "model"))
    party = str(about.get("party", folder.name if about else "centralized"))
    own = [n for names in model.features.values() for n in names]
    others: dict[str, set[int]] = {}
    for tree in model.trees:
        for node in tree.nodes:
            if not node.is_leaf and _held(model, node) is None:
                others.setdefault(node.owner, set()).add(node.record_id)
    return PartView(
        party=party, role=role, file=str(path), format=str(raw["format"]),
        version=int(raw["version"]), job=about.get("job"), features=own,
        categories={k: len(v) for k, v in categories.items()}, ensemble=model.ensemble,
        objective=model.params.objective, n_classes=model.n_classes,
        max_depth=model.params.max_depth, base_score=list(model.base_score),
        n_trees=len(model.trees), other_records={p: len(r) for p, r in sorted(others.items())},
        trees=[_tree_view(k, t, model, categories) for k, t in enumerate(model.trees)])


def _categories(folder: Path) -> dict[str, tuple[str, ...]]:
    try:
        return load_categories(folder)
    except DataError as exc:
        raise ConfigError(f"{ModelPart(folder).categories}: {exc}") from None


def _held(model: Model, node: TreeNode) -> str | None:
    """The node's feature name if this part holds it, else None (another party's record)."""
    names = model.features.get(node.owner, ())
    return names[node.feature] if 0 <= node.feature < len(names) else None


def _tree_view(index: int, tree: Tree, model: Model,
               categories: dict[str, tuple[str, ...]]) -> TreeView:
    depth = {tree.nodes[0].id: 0} if tree.nodes else {}
    views = []
    for node in tree.nodes:  # parents before children
        d = depth.get(node.id, 0)
        if node.is_leaf:
            views.append(NodeView(id=node.id, depth=d, leaf=True, value=node.value))
            continue
        depth[node.left] = depth[node.right] = d + 1
        name = _held(model, node)
        views.append(NodeView(
            id=node.id, depth=d, leaf=False, owner=node.owner, feature=name,
            threshold=None if name is None or math.isnan(node.threshold) else node.threshold,
            missing_left=node.missing_left if name is not None else None,
            record=node.record_id if name is None else None,
            left_categories=_left(categories, name, node.threshold),
            left=node.left, right=node.right))
    return TreeView(index=index, output=tree.output, depth=max(depth.values(), default=0),
                    leaves=sum(v.leaf for v in views), nodes=views)


def _left(categories: dict[str, tuple[str, ...]], name: str | None,
          threshold: float) -> list[str] | None:
    """A categorical split's categories going left (their codes are at most the threshold)."""
    if name is None or name not in categories:
        return None
    return [c for k, c in enumerate(categories[name]) if k <= threshold]


def _lookup_part(folder: Path, about: dict[str, Any],
                 categories: dict[str, tuple[str, ...]]) -> PartView:
    path = ModelPart(folder).lookup
    try:
        raw = json.loads(path.read_text())
        names, records = lookup_from_dict(raw)
    except (OSError, ValueError, KeyError, TypeError, ProtocolError) as exc:
        raise ConfigError(f"{path}: cannot read it as a lookup table ({exc})") from None
    return PartView(
        party=str(raw.get("party") or about.get("party") or folder.name), role="passive",
        file=str(path), format=str(raw["format"]), version=int(raw["version"]),
        job=raw.get("job"), features=list(names),
        categories={k: len(v) for k, v in categories.items()}, lookup_size=len(records),
        records=[_record_view(k, r, names, categories) for k, r in sorted(records.items())])


def _record_view(record: int, r: LookupRecord, names: tuple[str, ...],
                 categories: dict[str, tuple[str, ...]]) -> RecordView:
    name = names[r.feature] if 0 <= r.feature < len(names) else f"#{r.feature}"
    return RecordView(record=record, feature=name, threshold=r.threshold, bin=r.bin,
                      missing_left=r.missing_left,
                      left_categories=_left(categories, name, r.threshold), flip=r.flip)
