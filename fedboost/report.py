"""``fedboost report``: one self-contained HTML page about a finished training run.

The page shows how the model learned (train and validation metrics after each tree), where
the time went (seconds per tree and per protocol step), which features mattered (split count
and total gain), the trees themselves and, for classification, the leaf purity per tree
(SecureBoost Table 2: what a party seeing a tree's instance spaces could guess of the labels;
Completely SecureBoost keeps the first tree's from the passive parties).

A report is one party's: it names that party's own features and shows every other party's as
``party:feature#k`` (k: the column index in that party's data). The active party's (and a
member's) reads its model part and the gains it recorded in ``splits.json``; a passive
party's holds only what that party holds or learns: the job's size and its own splits, from
its lookup table (no tree shapes, gains, metrics, leaf values or purity: those come from the
labels). What is missing is left out and said so. Charts are inline SVG: the file opens
without a network.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from boosting import BoostingError
from boosting.tree import Model, Tree, TreeNode, load_model, open_private
from fedboost.report_html import folded, section, table
from fedboost.report_passive import own_splits, passive_note
from fedboost.tree_svg import tree_svg
from flows import run_charts
from flows.charts import bar_chart, line_chart
from workers import ProtocolError
from workers.column_partitioned.lookup import LookupRecord, lookup_from_dict
from workers.vertical.explain import SPLITS_FORMAT
from workers.model_folder import ModelPart, RunFolder

TOP_FEATURES = 20
"""Features shown in the importance charts (the table lists all)."""
TREES_DRAWN = 50
TREES_OPEN = 3
"""Trees drawn in the page, and how many of them are unfolded."""


class ReportError(ValueError):
    """The run folder cannot give a report (one line, naming the file)."""


@dataclass(slots=True)
class PartyView:
    """What one party's report may show of the run."""

    party: str
    role: str
    model: Model | None = None
    """The trees: the party's own model part, or the active party's for a passive party."""
    gains: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    """(tree, node) -> the active party's split record (owner, feature index, gain, rows)."""
    own_names: tuple[str, ...] = ()
    lookup: dict[int, LookupRecord] = field(default_factory=dict)
    """A passive party's own splits by record id."""
    notes: list[str] = field(default_factory=list)

    def owns(self, node: TreeNode) -> bool:
        """Whether the node splits on this party's columns (a horizontal model's members
        all hold every column)."""
        return node.owner == self.party or self.role in ("member", "aggregator")

    def split_label(self, node: TreeNode, tree: int) -> str:
        """The split's feature as this party may name it."""
        record = self.gains.get((tree, node.id))
        if self.owns(node):
            if self.role == "passive":
                return self.own_names[self.lookup[node.record_id].feature] \
                    if node.record_id in self.lookup else f"record {node.record_id}"
            return self.own_names[node.feature] if 0 <= node.feature < len(self.own_names) \
                else f"feature#{node.feature}"
        if record is not None:
            return f"{node.owner}:feature#{record['feature']}"
        if node.feature >= 0:
            return f"{node.owner}:feature#{node.feature}"
        return f"{node.owner}:record#{node.record_id}"

    def threshold(self, node: TreeNode) -> float | None:
        if not self.owns(node):
            return None
        if self.role == "passive":
            record = self.lookup.get(node.record_id)
            return record.threshold if record else None
        return node.threshold


def write_report(run_dir: Path, party: str | None = None, out: Path | None = None) -> Path:
    """Write ``party``'s report of the run in ``run_dir`` as one HTML file; return its path.

    Parameters
    ----------
    run_dir : the folder ``fedboost train --out`` wrote (job.json, metrics.json, party parts)
    party : whose report (default: the active party, or the first member)
    out : the HTML file (default ``run_dir/report.html``, ``report-PARTY.html`` for a party)

    Raises
    ------
    ReportError : the folder is not a finished run, or ``party`` is not one of its parties
    """
    run_dir = Path(run_dir)
    job = _read_json(RunFolder(run_dir).job, "not a fedboost run folder")
    metrics = _read_json(RunFolder(run_dir).metrics, "no metrics: the run has not finished")
    parties: dict[str, Any] = job.get("parties") or {}
    roles = {name: str(p.get("role", "")) for name, p in parties.items()}
    chosen = party or _default_party(roles)
    if chosen not in roles:
        raise ReportError(f"--party {chosen!r}: not a party of job {job.get('job')!r} "
                          f"({', '.join(roles)})")
    view = _party_view(run_dir, chosen, roles)
    html = render(job, metrics, view)
    path = out or RunFolder(run_dir).report(None if party is None else chosen)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_private(path) as handle:  # it names the party's features: the party's own
        handle.write(html)
    return path


def _read_json(path: Path, meaning: str) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path}: {meaning} ({exc})") from None
    if not isinstance(raw, dict):
        raise ReportError(f"{path}: {meaning} (not a JSON object)")
    return raw


def _default_party(roles: dict[str, str]) -> str:
    for role in ("active", "member"):
        for name, r in roles.items():
            if r == role:
                return name
    return next(iter(roles), "")


def _party_view(run_dir: Path, party: str, roles: dict[str, str]) -> PartyView:
    view = PartyView(party=party, role=roles[party])
    active = next((n for n, r in roles.items() if r == "active"), None)
    try:
        if view.role == "passive":
            lookup_file = ModelPart(run_dir / party).lookup
            if lookup_file.exists():
                view.own_names, view.lookup = lookup_from_dict(json.loads(lookup_file.read_text()))
            else:
                view.notes.append(f"{lookup_file} is missing: {party}'s splits are unnamed")
            return view  # a data provider's own: never the active party's trees or gains
        model_file = ModelPart(run_dir / party).model
        if model_file.exists():
            view.model = load_model(model_file)
            view.own_names = tuple(view.model.features.get(party, ())) or tuple(
                next(iter(view.model.features.values()), ()))
        else:
            view.notes.append(f"{model_file} is not in this folder: no trees to show")
        if active is not None:
            view.gains = _split_records(ModelPart(run_dir / active).splits, view.notes)
    except (OSError, ValueError, BoostingError, ProtocolError) as exc:
        raise ReportError(f"{run_dir}: party {party}: {exc}") from None
    return view


def _split_records(path: Path, notes: list[str]) -> dict[tuple[int, int], dict[str, Any]]:
    if not path.exists():
        notes.append(f"{path} is missing (a run before split gains were recorded): "
                     f"feature importance counts splits only")
        return {}
    raw = json.loads(path.read_text())
    if raw.get("format") != SPLITS_FORMAT:
        raise ReportError(f"{path}: not a {SPLITS_FORMAT} file")
    return {(int(s["tree"]), int(s["node"])): s for s in raw.get("splits", [])}


def feature_importance(view: PartyView) -> list[tuple[str, int, float | None]]:
    """(feature as the party may name it, split count, total gain or None), by gain then
    count."""
    found: dict[str, list[Any]] = {}
    if view.model is not None:
        for t, tree in enumerate(view.model.trees):
            for node in tree.nodes:
                if node.is_leaf:
                    continue
                entry = found.setdefault(view.split_label(node, t), [0, None])
                entry[0] += 1
                gain = view.gains.get((t, node.id))
                if gain is not None:
                    entry[1] = (entry[1] or 0.0) + float(gain["gain"])
    else:  # a passive party on its own: its lookup table has one record per split it owns
        for record in view.lookup.values():
            found.setdefault(view.own_names[record.feature], [0, None])[0] += 1
    rows = [(name, int(count), gain) for name, (count, gain) in found.items()]
    return sorted(rows, key=lambda r: (-(r[2] or 0.0), -r[1], r[0]))


def render(job: dict[str, Any], metrics: dict[str, Any], view: PartyView) -> str:
    """The report page."""
    history: list[dict[str, Any]] = metrics.get("trees") or []
    if view.role == "passive":  # what a data provider holds or learns, nothing more
        sections = [_summary(job, metrics, view), passive_note(job, view),
                    _importance(view), own_splits(view)]
    else:
        sections = [_summary(job, metrics, view), _learning(history, metrics),
                    _timing(metrics, history),
                    _importance(view), _purity(job, history), _trees(view)]
    name = escape(str(job.get("job", "")))
    notes = "".join(f"<li>{escape(n)}</li>" for n in view.notes)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>fedboost report: {name} ({escape(view.party)})</title>"
            f"<style>{_CSS}</style></head><body><h1>fedboost report: {name}</h1>"
            f"<p class=\"who\">party <b>{escape(view.party)}</b> ({escape(view.role)}); written "
            f"{time.strftime('%Y-%m-%d %H:%M')}</p>"
            + (f"<ul class=\"notes\">{notes}</ul>" if notes else "")
            + "".join(sections) + "</body></html>\n")


def _summary(job: dict[str, Any], metrics: dict[str, Any], view: PartyView) -> str:
    params = job.get("params") or {}
    final = [[k, v] for k, v in metrics.items()
             if k.startswith(("train_", "valid_")) and k != "train_seconds"
             and isinstance(v, (int, float))] if view.role != "passive" else []
    rows: list[list[Any]] = [
            ["protocol", job.get("protocol")],
            ["parties", ", ".join(f"{n} ({p.get('role')})"
                                  for n, p in (job.get("parties") or {}).items())],
            ["rows (aligned / train / validation)",
             f"{metrics.get('n_aligned')} / {metrics.get('n_train')} / {metrics.get('n_valid')}"],
            ["trees", metrics.get("n_trees")],
            ["depth, learning rate, bins",
             f"{params.get('max_depth')}, {params.get('learning_rate')}, {params.get('max_bin')}"],
            ["Paillier key bits", metrics.get("key_bits")],
            ["Completely SecureBoost", "yes" if params.get("complete_secure") else "no"],
            *([["training seconds", _seconds(metrics.get("train_seconds"))]]
              if view.role != "passive" else []),
            ["resumed after trees", metrics.get("resumed_after")],
            *(_stopping(metrics) if view.role != "passive" else []), *_privacy(metrics),
            *final]
    return section("summary", "Run", table([], rows))


def _seconds(value: Any) -> str | None:
    """Seconds as a reader wants them: '645.6', '12.3', '0.84'."""
    if not isinstance(value, (int, float)):
        return None
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _stopping(metrics: dict[str, Any]) -> list[list[Any]]:
    """The summary's early-stopping rows, when the job set ``early_stopping_rounds``."""
    if "best_iteration" not in metrics:
        return []
    grown = len(metrics.get("trees") or [])
    return [["early stopping",
             f"{metrics.get('best_metric')}: best round {metrics.get('best_iteration')} "
             f"({metrics.get('best_score', float('nan')):.4f}), "
             + (f"stopped after {grown} trees (no improvement in "
                f"{metrics.get('early_stopping_rounds')} rounds)" if metrics.get("stopped_early")
                else f"all {grown} trees grown") + f"; the model keeps {metrics.get('n_trees')}"]]


def _privacy(metrics: dict[str, Any]) -> list[list[Any]]:
    """The summary's differential-privacy row, when the job had a ``privacy:`` block."""
    if "epsilon" not in metrics:
        return []
    return [["differential privacy", f"epsilon {metrics['epsilon']:g}, spent "
             f"{metrics.get('epsilon_spent', 0):g}, {metrics.get('trees_per_ensemble')} trees "
             "per ensemble (docs/privacy.md)"]]


def _learning(history: list[dict[str, Any]], metrics: dict[str, Any]) -> str:
    charts = run_charts.learning_curves(history, metrics)
    if not charts:
        return section("learning-curves", "Learning curves", "<p>No metrics per tree.</p>")
    note = "" if any(k.startswith("valid_") for e in history for k in e) else (
        "<p>No validation rows in this run (validation.fraction 0): training metrics only.</p>")
    spent = run_charts.epsilon_chart(history)
    figures = [*charts.values(), *([spent] if spent else [])]
    return section("learning-curves", "Learning curves: metrics after each tree",
                    note + "".join(f'<figure>{svg}</figure>' for svg in figures))


def _timing(metrics: dict[str, Any], history: list[dict[str, Any]]) -> str:
    seconds = [e.get("seconds") for e in history]
    parts = []
    per_tree = line_chart({"seconds": [s if isinstance(s, (int, float)) else None
                                       for s in seconds]},
                          title="seconds per tree", x_label="tree", y_label="seconds",
                          chart_id="tree-seconds")
    if per_tree:
        parts.append(f"<figure>{per_tree}</figure>")
    steps: dict[str, float] = metrics.get("step_seconds") or {}
    if steps:
        parts.append(f"<figure>{run_charts.step_seconds_chart(steps)}</figure>")
        total = sum(steps.values()) or 1.0
        parts.append(folded(table(["step", "seconds", "share"],
                                    [[k, v, f"{100 * v / total:.1f} %"] for k, v in
                                     sorted(steps.items(), key=lambda item: -item[1])])))
    else:
        parts.append("<p>This run recorded no seconds per protocol step.</p>")
    return section("timing", "Where the time went", "".join(parts))


def _importance(view: PartyView) -> str:
    rows = feature_importance(view)
    if not rows:
        return section("feature-importance", "Feature importance", "<p>No splits.</p>")
    top = rows[:TOP_FEATURES]
    parts = [f"<p>Own features by name; other parties' as <code>party:feature#k</code> "
             f"(their column k). Party: {escape(view.party)}.</p>" if view.role != "passive"
             else f"<p>How often each of {escape(view.party)}'s features splits (its lookup "
                  f"table).</p>"]
    if any(gain is not None for _, _, gain in rows):
        parts.append("<figure>" + bar_chart([(n, g or 0.0) for n, _, g in top],
                                            title="total gain", value_label="sum of split gains",
                                            chart_id="importance-gain") + "</figure>")
    by_count = sorted(rows, key=lambda r: (-r[1], r[0]))[:TOP_FEATURES]
    parts.append("<figure>" + bar_chart([(n, float(c)) for n, c, _ in by_count],
                                        title="split count",
                                        value_label="splits", chart_id="importance-splits",
                                        colour="#ff7f0e") + "</figure>")
    if view.role == "passive":  # gains come from the active party's gradients: not its own
        parts.append(folded(table(["feature", "splits"], [[n, c] for n, c, _ in rows])))
    else:
        parts.append(folded(table(["feature", "splits", "total gain"],
                                    [list(r) for r in rows])))
    return section("feature-importance", "Feature importance", "".join(parts))


def _purity(job: dict[str, Any], history: list[dict[str, Any]]) -> str:
    chart = run_charts.leaf_purity_chart(history)
    if not chart:
        return ""
    values = [e.get(run_charts.LEAF_PURITY) for e in history]
    complete = bool((job.get("params") or {}).get("complete_secure"))
    text = ("<p>Leaf purity of a tree: the mean over its leaves, weighted by rows, of the share "
            "of a leaf's rows in its majority class (SecureBoost Table 2). A passive party that "
            "saw a tree's instance spaces could guess labels that well.")
    if complete:
        text += (" This run is <b>Completely SecureBoost</b>: the first tree was grown on the "
                 "active party's features alone, so no passive party saw its instance spaces; "
                 "the trees it did see are fitted to residuals.")
    text += "</p>"
    rest = [v for v in values[1:] if isinstance(v, (int, float))]
    rows = [["first tree", values[0]],
            ["later trees (mean)", sum(rest) / len(rest) if rest else None]]
    return section("leaf-purity", "Leaf purity per tree", text + f"<figure>{chart}</figure>"
                    + table(["", "leaf purity"], rows))


def _trees(view: PartyView) -> str:
    if view.model is None:
        return section("trees", "Trees", "<p>No trees in this folder for this party.</p>")
    parts = [f"<p>{len(view.model.trees)} trees; blue edges go left (value &le; threshold, "
             f"or the owner's decision), orange right.</p>"]
    for t, tree in enumerate(view.model.trees[:TREES_DRAWN]):
        svg = tree_svg(tree, functools.partial(_node_text, view, tree=t), f"tree-{t}")
        opened = " open" if t < TREES_OPEN else ""
        parts.append(f"<details{opened}><summary>tree {t}{_output(tree, view)}</summary>"
                     f'<div class="tree">{svg}</div></details>')
    if len(view.model.trees) > TREES_DRAWN:
        parts.append(f"<p>(first {TREES_DRAWN} trees drawn)</p>")
    return section("trees", "Trees", "".join(parts))


def _output(tree: Tree, view: PartyView) -> str:
    outputs = view.model.n_classes if view.model and view.model.n_classes > 2 else 1
    return f" (class {tree.output})" if outputs > 1 else ""


def _node_text(view: PartyView, node: TreeNode, tree: int) -> tuple[str, str]:
    if node.is_leaf:  # passive parties never learn leaf values
        return ("leaf", "" if view.role == "passive" else f"{node.value:+.4f}")
    threshold = view.threshold(node)
    record = view.gains.get((tree, node.id))
    shown = [f"\u2264 {threshold:.4g}"] if threshold is not None else []
    if record is not None:
        shown.append(f"gain {float(record['gain']):.3g}")
    return view.split_label(node, tree), " \u00b7 ".join(shown)


_CSS = """
body{font-family:sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px}
section{margin-bottom:28px}figure{margin:8px 12px 8px 0;display:inline-block;vertical-align:top}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.who{color:#555}.notes{color:#a05000}.tree{overflow-x:auto}
summary{cursor:pointer;margin:4px 0}
"""
