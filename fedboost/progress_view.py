"""How ``fedboost train`` shows a run's progress: a live bar on a terminal, plain lines
otherwise (CI, log files), nothing with ``--quiet``.

It listens to the flow's progress events (:mod:`flows.progress`): the stage (opening, PSI,
binning, trees, validation, saving), the protocol step under way and the parties that have
answered it, each finished tree with its seconds and training metrics, and parties that keep
a step waiting.
"""

from __future__ import annotations

import statistics
import time
from typing import IO, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from flows.progress import TREES, PartiesSilent, ProgressEvent, StepProgress, TreeProgress

RECENT_TREES = 10
"""Seconds per tree (and so the ETA) are the mean of the last this-many trees while trees are
being grown; once the last is done, the median of all the run grew (the run's figure)."""
SHOWN_METRICS = 2


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunProgress:
    """What the view knows of the run so far (shared by the bar and the plain lines)."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.step = ""
        self.answered = (0, 0)
        self.done = 0
        self.total: int | None = None
        self.recent: list[float] = []
        self.all_seconds: list[float] = []
        self.metrics: dict[str, float] = {}
        self.stage_started = time.monotonic()

    def update(self, event: StepProgress | TreeProgress) -> bool:
        """Take an event in (a silent party's is the views' own); True when the stage
        changed."""
        changed = False
        if isinstance(event, TreeProgress):
            self.done, self.total = event.done, event.total
            self.recent = [*self.recent, event.seconds][-RECENT_TREES:]
            self.all_seconds.append(event.seconds)
            self.metrics = event.metrics
            changed = self.stage != TREES
            self.stage = TREES
        else:
            changed = event.stage != self.stage
            self.stage, self.step = event.stage, event.step
            self.answered = (event.answered, event.parties)
        if changed:
            self.stage_started = time.monotonic()
        return changed

    @property
    def seconds_per_tree(self) -> float | None:
        if self.total is not None and self.done >= self.total and self.all_seconds:
            return statistics.median(self.all_seconds)
        return sum(self.recent) / len(self.recent) if self.recent else None

    @property
    def eta(self) -> float | None:
        per_tree = self.seconds_per_tree
        if per_tree is None or self.total is None:
            return None
        return per_tree * (self.total - self.done)

    def metrics_text(self) -> str:
        shown = [(k, v) for k, v in self.metrics.items() if k.startswith(("train_", "valid_"))]
        return ", ".join(f"{k}={v:.4f}" for k, v in shown[:SHOWN_METRICS])

    def tree_text(self) -> str:
        """'trees 3/30  1.20 s/tree  ETA 0:00:33  train_auc=0.7712'."""
        parts = [f"trees {self.done}/{self.total if self.total is not None else '?'}"]
        if self.seconds_per_tree is not None:
            parts.append(f"{self.seconds_per_tree:.2f} s/tree")
        if self.eta is not None:
            parts.append(f"ETA {_clock(self.eta)}")
        if self.metrics_text():
            parts.append(self.metrics_text())
        return "  ".join(parts)


class PlainLines:
    """One line per stage and per finished tree: for logs and CI."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.run = RunProgress()

    def __call__(self, event: ProgressEvent) -> None:
        if isinstance(event, PartiesSilent):
            self._print(event.text())
            return
        step = self.run.step
        changed = self.run.update(event)
        if isinstance(event, TreeProgress):
            self._print(self.run.tree_text())
        elif changed or (event.stage != TREES and event.step != step):
            # outside the trees every step gets a line: PSI and binning can take long
            self._print(f"{event.stage}: {event.step}")

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class LiveBar:
    """A rich progress bar: stage, trees done / total, seconds per tree, ETA, metrics."""

    def __init__(self, console: Console) -> None:
        self.run = RunProgress()
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<10}"),
            BarColumn(bar_width=30), TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
            console=console, transient=False, refresh_per_second=4)
        self.task = self.progress.add_task("run", total=None, stage="starting",
                                           detail="Prefect and the parties' workers")

    def __call__(self, event: ProgressEvent) -> None:
        if isinstance(event, PartiesSilent):  # a line that stays, and on the bar until answered
            self.progress.console.print(f"[yellow]{event.text()}[/yellow]")
            self.progress.update(self.task, detail=f"[yellow]{event.text()}[/yellow]")
            return
        changed = self.run.update(event)
        run = self.run
        if run.stage == TREES or isinstance(event, TreeProgress):
            detail = run.tree_text()
            if isinstance(event, StepProgress) and event.step:
                detail += f"  [dim]{event.step}[/dim]"
            self.progress.update(self.task, total=run.total, completed=run.done,
                                 stage=run.stage, detail=detail)
        else:
            answered, parties = run.answered
            detail = f"{run.step} ({answered}/{parties} parties answered)"
            if run.total is not None:  # after the trees: validation, saving
                detail = f"{run.tree_text()}  [dim]{detail}[/dim]"
            self.progress.update(self.task, stage=run.stage, detail=detail)
        if changed:  # every stage is drawn, however short (binning can take a fraction of 1 s)
            self.progress.refresh()

    def __enter__(self) -> LiveBar:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()


def progress_view(mode: str, stream: IO[str]) -> LiveBar | PlainLines | None:
    """The view for ``mode``: 'bar', 'lines' or 'quiet' (none)."""
    if mode == "bar":
        return LiveBar(Console(file=stream))
    if mode == "lines":
        return PlainLines(stream)
    return None
