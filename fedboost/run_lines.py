"""What 'fedboost train' and 'fedboost resume' print after a run: the result line (trees, or
a multiclass job's rounds and their trees), and after an interrupted or failed run the line
that continues it, when every party holds a checkpoint to continue from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedboost import api


def metrics_summary(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def resume_line(config: Any, command: str, out: Path, interrupted: bool, trees_reached: bool,
                 again: str) -> str | None:
    """The line after an interrupted or failed run: the command that continues it when every
    party holds a checkpoint (embedded: in ``out``; over RabbitMQ each worker holds its own,
    unseen from here: once the run reached the trees, after binning, they hold one), else that
    nothing was saved (None after a failure)."""
    if config.transport.kind == "rabbitmq":
        if trees_reached:
            return (f"the parties' workers keep their checkpoints: '{command}' continues "
                    f"after the last tree every party finished")
        return (f"this run stopped before the parties checkpointed it (they do after "
                f"binning): {again}" if interrupted else None)
    saved = checkpointed_trees(out, list(config.parties))
    if saved is None:
        return f"no party had saved a checkpoint of the job yet: {again}" if interrupted \
            else None
    after = f"after tree {saved - 1}" if saved else "after binning (no tree was finished)"
    return f"the parties keep their checkpoints: '{command}' continues {after}"


def checkpointed_trees(out: Path, parties: list[str]) -> int | None:
    """The trees every party of an embedded run in ``out`` holds a checkpoint after (0: after
    binning), or None when one holds none; read from the file names alone."""
    from workers.checkpoint import newest_on_disk
    from workers.forest.trees import held_on_disk

    counts = []
    for party in parties:
        found = newest_on_disk(out / party)
        if found is None:
            found = held_on_disk(out / party)  # a forest keeps finished trees, not states
        if found is None:
            return None
        counts.append(found)
    return min(counts) if counts else None


def quietly(line: Callable[[], str | None]) -> str | None:
    """A hint line, or None if making it fails (the error it would follow comes first)."""
    try:
        return line()
    except Exception:  # noqa: BLE001  e.g. an unreadable job file: the run's error says why
        return None


def report_training(result: api.TrainResult) -> int:
    resumed = result.metrics["resumed_after"]
    from flows.declared import declaration

    rows = "rows" if declaration(result.protocol).shared_model else "aligned rows"
    if result.model_parts:
        where = f"model in {result.run_dir}/"
    else:  # over RabbitMQ each party's worker wrote its own part
        where = (f"metrics in {result.run_dir}/; each party's worker keeps its model part in "
                 f"its models folder, models/{result.job}/<party>/")
    if result.metrics.get("stopped_early"):
        m = result.metrics
        print(f"stopped early after {len(m['trees'])} trees: {m['best_metric']} did not "
              f"improve for {m['early_stopping_rounds']} rounds after round "
              f"{m['best_iteration']} ({m['best_score']:.4f}); the model keeps its "
              f"{result.n_trees} trees")
    print(f"trained {trees_text(result.n_trees, result.metrics)}"
          f"{f' (resumed after {resumed} trees)' if resumed else ''}"
          f" on {result.metrics['n_aligned']} {rows} in {result.metrics['train_seconds']:.1f} s: "
          f"{metrics_summary(result.final_metrics)}; {where}")
    return 0


def trees_text(n_trees: int, metrics: dict[str, Any]) -> str:
    """'30 trees', or for multiclass '10 rounds (40 trees: one per class per round)'."""
    per_round = int(metrics.get("trees_per_round") or 1)
    if per_round <= 1:
        return f"{n_trees} trees"
    rounds = n_trees / per_round
    shown = f"{rounds:.0f}" if rounds == int(rounds) else f"{rounds:.2f}"
    return (f"{shown} round{'s' if rounds != 1 else ''} ({n_trees} trees: one per class per "
            f"round)")
