"""The owner of a training run: what every protocol's flow does around its trees.

A protocol supplies its algorithm as a ``RunProtocol``: open the job (set up, or resume from
the checkpoints every party holds), grow one tree, score the hold-out rows, save the model.
``TrainingRun`` owns the rest, the same for every protocol: the per-tree loop with its timing,
records, log lines and progress; early stopping and the privacy budget as callbacks on the
loop (XGBoost's ``TrainingCallback``); the final save and close (a party whose worker lost the
job after saving is no failure); the UI's artifacts; and the frozen ``RunResult`` that
``metrics.json``, the Python API's ``TrainResult`` and the report read.

A run that loses a party's state (its worker restarted) is run again by
``flows.coordinator.train_with_recoveries``: a fresh ``TrainingRun`` on the same protocol
object, which keeps what must outlive a recovery (horizontal's dropped members).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from flows import run_charts
from flows.coordinator import PartyError, close_job, link, record_tree, train_with_recoveries
from flows.early_stopping import EarlyStopping
from messages.bodies import Aligned

if TYPE_CHECKING:
    from flows.job_schema import PrivacyConfig

Metrics = dict[str, Any]
"""One tree's metrics as the parties report them (numbers, and a few names)."""
Scored = tuple[Metrics, list[Metrics]]
"""Validation metrics of the model, and after each of its trees."""


@dataclass(frozen=True, slots=True)
class Start:
    """Where a run starts: its rows, trees per round, and what an earlier run of the job left."""

    rows: Aligned
    per_round: int
    """Trees per round: the classes in multiclass, else 1."""
    done: int = 0
    """Trees an earlier run finished, which every party holds."""
    history: list[Metrics] = field(default_factory=list)
    """The metrics of those trees, where the parties kept them."""


class RunProtocol:
    """A protocol's part of a training run; its flow module subclasses this.

    ``open`` and ``grow`` are the algorithm; the others have the defaults most protocols want.
    """

    def __init__(self, config: Any, parties: list[str]) -> None:
        self.config = config
        self.parties = parties
        """Every party of the run: they save the model and close the job."""

    @property
    def job(self) -> str:
        return str(self.config.job)

    def open(self) -> Start:
        """Open the job at every party; set up (align, bin, ...) or resume."""
        raise NotImplementedError

    def n_trees(self, start: Start) -> int:
        """Trees the run grows: ``params.n_trees`` rounds of ``per_round`` trees."""
        return int(self.config.params.n_trees) * start.per_round

    def grow(self, tree: int) -> Metrics:
        """Grow tree ``tree``; returns its metrics."""
        raise NotImplementedError

    def hold(self, tree: int, held: Callable[[], None]) -> None:
        """Make every party hold the tree just grown, then call ``held`` (the run's progress
        moves: "trees k/n" is a point to resume from). At once by default."""
        held()

    def settle(self) -> None:
        """Wait until every tree handed to ``hold`` is held (its errors are raised here)."""

    def grow_all(self, run: TrainingRun) -> None:
        """Grow the run's trees: one after another (``TrainingRun.boost``) by default."""
        run.boost()

    def validate(self, after: int = -1) -> Scored | None:
        """Score the hold-out rows with the model (of its first ``after`` trees); None: the
        protocol keeps no hold-out rows."""
        return None

    def save(self, keep: int | None) -> None:
        """Every party writes its part of the model of the first ``keep`` trees (None: all)."""
        raise NotImplementedError

    def summary(self, run: TrainingRun) -> Metrics:
        """The protocol's own result keys (they override the run's), asked once the model is
        saved and before the job closes."""
        return {}


class TrainingCallback:
    """Watches the loop (XGBoost's ``TrainingCallback``): after each round, and at the end."""

    def after_round(self, run: TrainingRun, trees: int) -> bool:
        """The model has ``trees`` trees, a whole round; return True to stop training."""
        return False

    def after_training(self, run: TrainingRun, scored: Scored | None) -> None:
        """Every tree is grown and held; ``scored``: the model's validation metrics."""

    def kept_trees(self, trained: int) -> int | None:
        """Trees the saved model keeps, if this callback decides (None: all)."""
        return None

    def keys(self, run: TrainingRun) -> Metrics:
        """What this callback adds to the run's result."""
        return {}


class EarlyStop(TrainingCallback):
    """Early stopping on the hold-out rows (``flows.early_stopping``)."""

    def __init__(self, rounds: int, per_round: int) -> None:
        self.stopper = EarlyStopping(rounds, per_round)

    def after_round(self, run: TrainingRun, trees: int) -> bool:
        run.protocol.settle()  # every party holds the trees before they score
        scored = run.protocol.validate(trees)
        if scored is None or not self.stopper.after_round(*scored, trees):
            return False
        run.log.info("early stopping after %d trees: %s", trees, self.stopper.says())
        return True

    def after_training(self, run: TrainingRun, scored: Scored | None) -> None:
        trained = len(run.history)
        if scored is not None and not self.stopper.scored(trained):  # resumed after the last
            self.stopper.after_round(*scored, trained)

    def kept_trees(self, trained: int) -> int | None:
        return self.stopper.kept_trees(trained)

    def keys(self, run: TrainingRun) -> Metrics:
        return self.stopper.summary()  # the kept model's metrics, and where it stopped


class PrivacyBudget(TrainingCallback):
    """Differential privacy's budget (docs/privacy.md): each started ensemble its share."""

    def __init__(self, privacy: PrivacyConfig) -> None:
        self.privacy = privacy

    def after_training(self, run: TrainingRun, scored: Scored | None) -> None:
        for k, entry in enumerate(run.history):  # the budget spent by each tree, for the curve
            entry["epsilon_spent"] = self.privacy.spent(k + 1, run.n_trees)

    def keys(self, run: TrainingRun) -> Metrics:
        return {"epsilon": self.privacy.epsilon,
                "epsilon_spent": self.privacy.spent(len(run.history), run.n_trees),
                "trees_per_ensemble": self.privacy.per_ensemble(run.n_trees)}


def callbacks_of(config: Any, start: Start) -> list[TrainingCallback]:
    """The callbacks a job's settings ask for."""
    found: list[TrainingCallback] = []
    rounds = getattr(config.params, "early_stopping_rounds", None)
    if rounds:
        found.append(EarlyStop(rounds, start.per_round))
    privacy = getattr(config, "privacy", None)  # SimFL's noise is in its own params
    if privacy is not None:
        found.append(PrivacyBudget(privacy))
    return found


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished training run. A flow returns it ``as_dict()`` (Prefect and the callers of a
    flow get plain data); ``from_dict`` reads that back, ``as_metrics_json`` is the file."""

    n_aligned: int
    n_train: int
    n_valid: int
    n_trees: int
    """Trees in the saved model."""
    trees_per_round: int
    resumed_after: int
    """Trees an earlier run of the job had finished."""
    trees_trained: int
    train_seconds: float
    tree_seconds: list[float | None]
    """Per tree; None for a tree an earlier run grew."""
    history: list[Metrics]
    """Per tree: its metrics (train, validation where scored, epsilon spent)."""
    step_seconds: dict[str, float]
    reported: Metrics
    """The model's final metrics and the protocol's and callbacks' keys."""

    def as_dict(self) -> dict[str, Any]:
        counts = {"n_aligned": self.n_aligned, "n_train": self.n_train, "n_valid": self.n_valid,
                  "n_trees": self.n_trees, "trees_per_round": self.trees_per_round,
                  "resumed_after": self.resumed_after, "trees_trained": self.trees_trained}
        return {**counts, **self.reported, "train_seconds": self.train_seconds,
                "tree_seconds": self.tree_seconds, "history": self.history,
                "step_seconds": self.step_seconds}

    @classmethod
    def from_dict(cls, result: Mapping[str, Any]) -> RunResult:
        """A flow's result read back; a key the run owner always writes missing, or per-tree
        lists of unequal length, is a protocol's flow that bypassed it (ValueError)."""
        fields = ("n_aligned", "n_train", "n_valid", "n_trees", "trees_per_round",
                  "resumed_after", "trees_trained", "train_seconds", "tree_seconds", "history",
                  "step_seconds")
        missing = [k for k in fields if k not in result]
        if missing:
            raise ValueError(f"a training flow's result lacks {', '.join(missing)}")
        if len(result["tree_seconds"]) != len(result["history"]):
            raise ValueError("a training flow's result has per-tree seconds and metrics of "
                             f"{len(result['tree_seconds'])} and {len(result['history'])} trees")
        known = {k: result[k] for k in fields}
        return cls(**known, reported={k: v for k, v in result.items() if k not in known})

    def as_metrics_json(self) -> dict[str, Any]:
        """What ``metrics.json`` holds: the ``history`` as ``trees`` rows (index, seconds,
        metrics)."""
        out = self.as_dict()
        history = out.pop("history")
        out["trees"] = [{"tree": k, "seconds": s, **m}
                        for k, (s, m) in enumerate(zip(self.tree_seconds, history, strict=True))]
        return out


def train_run(config: Any, protocol: RunProtocol) -> dict[str, Any]:
    """A protocol's flow body: the run (again after a party lost its state), as plain data."""
    return train_with_recoveries(config, lambda _, progress: TrainingRun(protocol, progress)
                                 .train()).as_dict()


class TrainingRun:
    """One attempt at a training run (``train``), with the state its loop builds."""

    def __init__(self, protocol: RunProtocol, progress: Any) -> None:
        self.protocol = protocol
        self.progress = progress
        self.log = get_run_logger()
        self.start = Start(Aligned(0, 0, 0), 1)
        self.n_trees = 0
        self.history: list[Metrics] = []
        self.tree_seconds: list[float | None] = []
        self.callbacks: list[TrainingCallback] = []

    @property
    def job(self) -> str:
        return self.protocol.job

    def train(self) -> RunResult:
        started = time.perf_counter()
        self.start = start = self.protocol.open()
        if start.done:
            self.log.info("resumed after %d trees from every party's checkpoint", start.done)
        self.log.info("%d rows (%d train, %d validation)", start.rows.n_aligned,
                      start.rows.n_train, start.rows.n_valid)
        self.n_trees = self.protocol.n_trees(start)
        self.history = list(start.history)
        self.tree_seconds = [None] * start.done  # grown by an earlier run
        self.callbacks = callbacks_of(self.protocol.config, start)
        self.protocol.grow_all(self)
        self.protocol.settle()
        scored = self.protocol.validate() if start.rows.n_valid else None
        for callback in self.callbacks:
            callback.after_training(self, scored)
        if scored is not None and len(scored[1]) == len(self.history):  # the hold-out curve
            self.history = [{**m, **valid} for m, valid in zip(self.history, scored[1],
                                                                strict=True)]
        trained = len(self.history)
        limits = [k for c in self.callbacks if (k := c.kept_trees(trained)) is not None]
        keep = min(limits) if limits else None
        self.protocol.save(keep)
        kept = trained if keep is None else keep
        last = self.history[kept - 1] if kept else {}
        reported = {k: v for k, v in last.items() if k.startswith("train_")}
        reported.update(scored[0] if scored is not None else {})
        for callback in self.callbacks:
            reported.update(callback.keys(self))
        reported.update(self.protocol.summary(self))
        self.close()
        counts = {"n_trees": kept, "trees_trained": trained - start.done,
                  "resumed_after": start.done}
        counts.update({k: reported.pop(k) for k in list(reported) if k in counts})
        result = RunResult(
            n_aligned=start.rows.n_aligned, n_train=start.rows.n_train,
            n_valid=start.rows.n_valid, trees_per_round=start.per_round,
            **counts, train_seconds=time.perf_counter() - started,
            tree_seconds=self.tree_seconds, history=self.history,
            step_seconds=dict(link(self.job).step_seconds), reported=reported)
        self.publish(result)
        return result

    def boost(self) -> None:
        """The trees one after another; the callbacks may stop after a round."""
        for tree in range(self.start.done, self.n_trees):
            began = time.perf_counter()
            metrics = self.protocol.grow(tree)
            seconds = time.perf_counter() - began
            self.tree_seconds.append(seconds)
            self.history.append(metrics)
            self.protocol.hold(tree, partial(self.record, tree + 1, seconds, metrics))
            self.log.info("tree %d done (%d/%d) in %.2f s: %s", tree, tree + 1, self.n_trees,
                          seconds, shown(metrics))
            if (tree + 1) % self.start.per_round == 0:
                stops = [c.after_round(self, tree + 1) for c in self.callbacks]
                if any(stops):
                    break

    def record(self, done: int, seconds: float, metrics: Metrics) -> None:
        """``done`` trees are held by every party: the progress artifact and bar move."""
        record_tree(self.job, self.progress, done, self.n_trees, seconds, metrics)

    def close(self) -> None:
        """Every party releases the job; one whose worker lost it after saving is no failure."""
        try:
            close_job(self.job, self.protocol.parties)
        except PartyError as exc:
            if not exc.reply.state_lost:
                raise
            self.log.warning("%s; its model part is saved, nothing left to close", exc)

    def publish(self, result: RunResult) -> None:
        """The UI's artifacts: the per-tree table and the learning charts."""
        final = ", ".join(f"{k}={v:.4f}" for k, v in result.reported.items()
                          if k.startswith(("train_", "valid_")) and isinstance(v, float))
        create_table_artifact(
            [{"tree": k + 1, "seconds": None if sec is None else round(sec, 3),
              **{key: value for key, value in m.items() if key != "members"}}
             for k, (sec, m) in enumerate(zip(result.tree_seconds, result.history,
                                              strict=True))],
            description=f"{self.job}: metrics per tree" + (f"; final {final}" if final else ""))
        run_charts.publish(self.job, result.as_dict())


def shown(metrics: Metrics) -> str:
    """A tree's metrics on one log line (names, then the numbers)."""
    return ", ".join([f"{k}={v}" for k, v in metrics.items() if isinstance(v, str)]
                     + [f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float)])
