"""What the Python API returns (``fedboost.api``): a finished training run (``TrainResult``, its
per-tree ``TreeRecord`` history) and a finished scoring run (``PredictResult``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class TreeRecord:
    """One tree of a run: its index, seconds to grow it (None: an earlier, interrupted run of
    the job grew it) and the metrics after it."""

    tree: int
    seconds: float | None
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class TrainResult:
    """A finished training run (federated or centralized)."""

    job: str
    protocol: str
    run_dir: Path
    metrics: dict[str, Any]
    """What ``metrics.json`` holds (row counts, final metrics, seconds, ``trees``, ...)."""
    history: list[TreeRecord]
    model_parts: dict[str, Path]
    """Each party's model file in ``run_dir`` (``model.json``, or a passive party's
    ``lookup.json``); over RabbitMQ the parties' workers keep theirs, so none is here."""

    @property
    def n_trees(self) -> int:
        """Trees in the model."""
        return int(self.metrics["n_trees"])

    @property
    def final_metrics(self) -> dict[str, float]:
        """The model's ``train_*`` and ``valid_*`` metrics after its last tree."""
        return {k: float(v) for k, v in self.metrics.items()
                if k.startswith(("train_", "valid_")) and k != "train_seconds"
                and isinstance(v, (int, float))}

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> TrainResult:
        """The result of a run ``fedboost train`` (or :func:`train`) wrote to ``run_dir``."""
        from workers.model_folder import RunFolder
        from flows.config import ConfigError

        folder = Path(run_dir)
        try:
            metrics = json.loads(RunFolder(folder).metrics.read_text())
            job = json.loads(RunFolder(folder).job.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{folder}: not a finished training run ({exc})") from None
        return cls(job=str(job["job"]), protocol=str(job.get("protocol",
                                                              "vertical_secureboost")),
                   run_dir=folder, metrics=metrics, history=tree_history(metrics),
                   model_parts=model_parts_in(folder, list(job.get("parties", {}))))


@dataclass(frozen=True, slots=True)
class PredictResult:
    """A finished scoring run."""

    n_scored: int
    seconds: float
    mode: str
    """``path`` or ``batched`` (federated), ``local`` (a member's copy of a shared model)."""
    party: str
    """Who scored: the active party (federated) or the member."""
    scores_file: Path | None
    """The scores here (``id,score``; see the README); None over RabbitMQ, where the active
    party's worker keeps them (``remote_file``)."""
    remote_file: str | None = None
    """Over RabbitMQ: the scores file in the active party's models folder (``JOB/PARTY/F``)."""

    def read_scores(self) -> tuple[list[str], np.ndarray]:
        """The scored ids and the score columns (rows x columns) of ``scores_file``."""
        import csv

        import numpy as np

        if self.scores_file is None:
            raise ValueError(f"the scores are at party {self.party}: {self.remote_file}")
        with open(self.scores_file, newline="") as handle:
            header, *rows = list(csv.reader(handle))
        scores = [k for k, name in enumerate(header) if k and name != "split"]
        return [r[0] for r in rows], np.array([[float(r[k]) for k in scores] for r in rows])


def tree_history(metrics: Mapping[str, Any]) -> list[TreeRecord]:
    return [TreeRecord(tree=int(t["tree"]), seconds=t.get("seconds"),
                       metrics={k: float(v) for k, v in t.items()
                                if k not in ("tree", "seconds") and isinstance(v, (int, float))})
            for t in metrics.get("trees", [])]


def model_parts_in(run_dir: Path, parties: list[str]) -> dict[str, Path]:
    """Each party's model part file: its model, else its lookup table (``PART_FILES``)."""
    from workers.model_folder import ModelPart

    parts = {}
    for party in parties:
        part = ModelPart(run_dir / party)
        for path in (part.model, part.lookup):
            if path.is_file():
                parts[party] = path
    return parts


def write_json(path: Path, payload: Any, mode: int = 0o644) -> None:
    from boosting.tree import write_json_atomic

    write_json_atomic(path, payload, permissions=mode)
