"""The charts of a training run that its metrics alone give: learning curves, seconds per
protocol step, leaf purity per tree. ``fedboost report`` draws them into its page, and every
training flow publishes them as Prefect artifacts on its run, so the UI shows them too.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from flows.charts import bar_chart, line_chart

LEAF_PURITY = "leaf_purity"
"""Per-tree metric of classification jobs (SecureBoost Table 2; vertical only)."""
EPSILON_SPENT = "epsilon_spent"
"""Per-tree entry of a differentially private job: the budget spent once that tree is grown."""


def metric_series(history: Sequence[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Per metric name (train_*, valid_*), its value after each tree (``None`` if absent)."""
    names = sorted({k for entry in history for k, v in entry.items()
                    if k.startswith(("train_", "valid_")) and isinstance(v, (int, float))})
    return {name: [_number(entry.get(name)) for entry in history] for name in names}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def learning_curves(history: Sequence[dict[str, Any]],
                    metrics: dict[str, Any] | None = None) -> dict[str, str]:
    """One line chart per metric kind (auc, logloss, ...): its train and valid lines; where
    early stopping kept the model (``metrics``' ``best_iteration``), a marker."""
    marker = kept_marker(metrics or {}, len(history))
    private = privacy_label(metrics or {})
    series = metric_series(history)
    kinds = sorted({name.split("_", 1)[1] for name in series})
    charts = {}
    for kind in kinds:
        lines: dict[str, Sequence[float | None]] = {
            name: values for name, values in series.items() if name.split("_", 1)[1] == kind}
        charts[kind] = line_chart(lines, title=f"{kind} after each tree{private}",
                                  x_label="tree", y_label=kind, chart_id=f"curve-{kind}",
                                  marker=marker)
    return charts


def privacy_label(metrics: dict[str, Any]) -> str:
    """The learning curves' title suffix of a differentially private job: its budget."""
    epsilon = metrics.get("epsilon")
    if not isinstance(epsilon, (int, float)):
        return ""
    return (f" (epsilon-DP, epsilon {epsilon:g}, spent {metrics.get('epsilon_spent', 0):g}, "
            f"{metrics.get('trees_per_ensemble')} trees per ensemble)")


def epsilon_chart(history: Sequence[dict[str, Any]]) -> str:
    """Epsilon spent once each tree is grown (a step per ensemble), if the job was private."""
    values = [_number(entry.get(EPSILON_SPENT)) for entry in history]
    if not any(v is not None for v in values):
        return ""
    return line_chart({"epsilon spent": values}, title="privacy budget spent after each tree "
                      "(docs/privacy.md)", x_label="tree", y_label="epsilon",
                      chart_id="epsilon-spent")


def kept_marker(metrics: dict[str, Any], grown: int) -> tuple[int, str] | None:
    """Early stopping's point on the learning curve: the kept model's last tree (by its index,
    as the curve's x axis), labelled with the best round and where training stopped."""
    best, kept = metrics.get("best_iteration"), metrics.get("n_trees")
    if not isinstance(best, int) or not isinstance(kept, int):
        return None
    stopped = (f"stopped after {grown} trees" if metrics.get("stopped_early")
               else "no early stop")
    return kept - 1, f"best round {best} ({kept} trees kept); {stopped}"


def step_seconds_chart(step_seconds: dict[str, float]) -> str:
    """Seconds spent per protocol step over the run, longest first."""
    bars = sorted(step_seconds.items(), key=lambda item: -item[1])
    return bar_chart(bars, title="seconds per protocol step (whole run)", value_label="seconds",
                     chart_id="step-seconds")


def leaf_purity_chart(history: Sequence[dict[str, Any]]) -> str:
    """Leaf purity after each tree, if the run recorded it."""
    values = [_number(entry.get(LEAF_PURITY)) for entry in history]
    if not any(v is not None for v in values):
        return ""
    return line_chart({"leaf purity": values}, title="leaf purity per tree (SecureBoost "
                      "Table 2)", x_label="tree", y_label="purity", chart_id="leaf-purity")


def svg_data_uri(svg: str) -> str:
    """An SVG as a ``data:`` URI (an ``<img>`` source needing no network)."""
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()


def publish(job: str, result: dict[str, Any]) -> None:
    """Create the run's chart artifacts (markdown with embedded SVG images) in Prefect."""
    from prefect.artifacts import create_markdown_artifact

    history = result.get("history") or []
    parts = [f"# {job}: how the model learned", ""]
    for kind, svg in learning_curves(history, result).items():
        parts += [f"![{kind} after each tree]({svg_data_uri(svg)})", ""]
    spent = epsilon_chart(history)
    if spent:
        parts += ["Differential privacy: each ensemble of trees spends its share of epsilon "
                  "when its first tree is grown.", "", f"![epsilon spent]({svg_data_uri(spent)})",
                  ""]
    purity = leaf_purity_chart(history)
    if purity:
        parts += ["Leaf purity: the mean share of a leaf's rows in its majority class, what a "
                  "party seeing a tree's instance spaces could guess of the labels.", "",
                  f"![leaf purity]({svg_data_uri(purity)})", ""]
    steps = result.get("step_seconds") or {}
    if steps:
        parts += ["## Where the time went", "", f"![seconds per step]"
                  f"({svg_data_uri(step_seconds_chart(steps))})", "",
                  "| step | seconds |", "|---|---|"]
        parts += [f"| {name} | {seconds:.2f} |" for name, seconds in
                  sorted(steps.items(), key=lambda item: -item[1])]
    create_markdown_artifact("\n".join(parts), key=_artifact_key(job),
                             description=f"{job}: learning curves and seconds per step")


def _artifact_key(job: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    cleaned = "".join(c if c.isalnum() else "-" for c in job.lower())
    return f"{cleaned.strip('-') or 'job'}-charts"
