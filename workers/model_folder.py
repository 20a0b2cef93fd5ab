"""A model folder and a run folder, with the names of their files written once.

A party's **model part** is the folder its worker writes for one job (``models/JOB/PARTY``, or
``PARTY`` inside a run folder): its model file, the party's record of the job, and what only
that party holds (a passive party's lookup table, the codes of its text columns, the active
party's split records and training rows). A **run folder** is what ``fedboost train`` writes
(``runs/NAME``): the job file as it ran, the metrics, the report and one model part per party.
Code that reads or writes one of these files takes its path from here, never a literal name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODEL = "model.json"
"""The model (``boosting.tree.save_model``): the whole model, or the active party's part."""
PARTY = "party.json"
"""The party's record of the job: its name, role, protocol and job (``party_info``)."""
LOOKUP = "lookup.json"
"""A passive party's lookup table: record id -> its feature and threshold."""
CATEGORIES = "categories.json"
"""The codes a party gave the values of its text columns (``workers.data``)."""
SPLITS = "splits.json"
"""The active party's split records (gains, for the report)."""
TRAINING_ROWS = "training_rows.json"
"""The aligned ids by their role in training (train or valid), for scoring's metrics."""
SCORES = "scores.csv"
"""``fedboost predict``'s scores, by default."""
JOB = "job.json"
"""The job file as it ran (a run folder's)."""
METRICS = "metrics.json"
"""The run's result (``flows.run.RunResult.as_metrics_json``)."""
PART_FILES = (MODEL, LOOKUP)
"""A folder holding either is a model part."""


@dataclass(frozen=True, slots=True)
class ModelPart:
    """One party's model part of one job."""

    path: Path

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def party(self) -> Path:
        return self.path / PARTY

    @property
    def lookup(self) -> Path:
        return self.path / LOOKUP

    @property
    def categories(self) -> Path:
        return self.path / CATEGORIES

    @property
    def splits(self) -> Path:
        return self.path / SPLITS

    @property
    def training_rows(self) -> Path:
        return self.path / TRAINING_ROWS

    @property
    def scores(self) -> Path:
        return self.path / SCORES

    def holds_a_part(self) -> bool:
        """Whether the folder holds a model part (a model file or a lookup table)."""
        return any((self.path / name).is_file() for name in PART_FILES)


@dataclass(frozen=True, slots=True)
class RunFolder:
    """What ``fedboost train`` writes for one run."""

    path: Path

    @property
    def job(self) -> Path:
        return self.path / JOB

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def scores(self) -> Path:
        return self.path / SCORES

    def report(self, party: str | None = None) -> Path:
        """The report: the whole run's, or the one a party's view gives (``report-P.html``)."""
        return self.path / ("report.html" if party is None else f"report-{party}.html")

    def part(self, party: str) -> ModelPart:
        return ModelPart(self.path / party)

    def is_run(self) -> bool:
        return self.job.is_file()
