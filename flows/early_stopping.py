"""Early stopping on a validation curve, as XGBoost's ``EarlyStopping`` callback decides it.

Training stops after the round whose validation score has not improved on the best one for
``rounds`` rounds; the model keeps the rounds up to the best one. A round is one tree (one
per class in multiclass). The score is the first validation metric the objective reports
(``boosting.metrics.evaluate``, in its order): AUC for binary, accuracy for multiclass, RMSE for
regression; improving means strictly greater (AUC, accuracy) or strictly smaller (logloss,
RMSE), as in XGBoost with ``min_delta`` 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAXIMIZED = ("auc", "accuracy")
"""Metrics whose larger values are better; the others (logloss, rmse) are minimised."""


@dataclass(frozen=True, slots=True)
class StopPoint:
    """Where a validation curve stands for early stopping."""

    metric: str
    """The validation metric watched, e.g. ``valid_auc``."""
    best_iteration: int
    """The best round, counted from 0 (XGBoost's ``best_iteration``)."""
    best_score: float
    rounds_done: int
    stop: bool
    """No improvement for ``rounds`` rounds after the best one: train no further."""


def maximized(metric: str) -> bool:
    """Whether larger values of ``metric`` (``valid_auc``, ``auc``, ...) are better."""
    return metric.rsplit("_", 1)[-1] in MAXIMIZED


def stop_point(metric: str, scores: list[float], rounds: int) -> StopPoint:
    """The best round of a validation curve (one score per round, in order; NaN for rounds
    not scored) and whether training stops after its last round.

    Raises
    ------
    ValueError
        ``rounds`` below 1 (a programming error: the job file is checked).
    """
    if rounds < 1:
        raise ValueError(f"early stopping needs rounds >= 1, not {rounds}")
    sign = 1.0 if maximized(metric) else -1.0
    best: int | None = None
    for k, score in enumerate(scores):
        if not math.isnan(score) and (best is None or sign * score > sign * scores[best]):
            best = k
    if best is None:
        return StopPoint(metric, len(scores) - 1, math.nan, len(scores), False)
    return StopPoint(metric, best, float(scores[best]), len(scores),
                     len(scores) - 1 - best >= rounds)


def first_metric(metrics: dict[str, float]) -> str:
    """The validation metric early stopping watches: the first one reported."""
    return next(k for k in metrics if k.startswith("valid_"))


@dataclass(slots=True)
class EarlyStopping:
    """The flow's watch over the validation curve, round by round (XGBoost's
    ``EarlyStopping`` callback)."""

    rounds: int
    """``early_stopping_rounds``."""
    outputs: int
    """Trees per round (classes in multiclass, else 1)."""
    per_round: list[dict[str, float]] = field(default_factory=list)
    """The validation metrics of the model after each round ({} where unknown)."""
    point: StopPoint | None = None

    def after_round(self, final: dict[str, float], per_tree: list[dict[str, float]],
                    trees: int) -> bool:
        """Take the validation metrics of the model of ``trees`` trees (``final``) and, when
        they were kept, after each of its trees (``per_tree``: after a resume they give the
        rounds before it); return whether training stops here."""
        if len(per_tree) == trees:
            self.per_round = per_tree[self.outputs - 1::self.outputs]
        else:
            done = trees // self.outputs
            self.per_round = (self.per_round + [{}] * done)[:done - 1] + [final]
        metric = first_metric(final)
        self.point = stop_point(metric, [m.get(metric, math.nan) for m in self.per_round],
                                self.rounds)
        return self.point.stop

    def scored(self, trees: int) -> bool:
        """Whether the model of ``trees`` trees has been scored."""
        return len(self.per_round) * self.outputs == trees

    def kept_trees(self, trees: int) -> int:
        """Trees the saved model keeps: up to the best round (all ``trees`` if none)."""
        if self.point is None:
            return trees
        return (self.point.best_iteration + 1) * self.outputs

    def says(self) -> str:
        """One line: where the curve stood when training stopped."""
        p = self.point
        if p is None:
            return "no validation score"
        return (f"{p.metric} did not improve for {self.rounds} rounds after round "
                f"{p.best_iteration} ({p.best_score:.4f})")

    def summary(self) -> dict[str, object]:
        """``metrics.json``'s early-stopping keys, and the kept model's validation metrics."""
        p = self.point
        if p is None:
            return {"early_stopping_rounds": self.rounds, "stopped_early": False}
        return {**self.per_round[p.best_iteration], "best_iteration": p.best_iteration,
                "best_score": p.best_score, "best_metric": p.metric,
                "early_stopping_rounds": self.rounds, "stopped_early": p.stop}
