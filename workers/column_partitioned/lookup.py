"""A passive party's lookup table (SecureBoost Sec. 3): ``record_id -> (feature, threshold,
missing direction)`` for the splits it owns, the only model part it keeps, and its file form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from boosting.binning import goes_left_raw
from workers import ProtocolError

LOOKUP_FORMAT = "fedboost-lookup"
LOOKUP_VERSION = 1


@dataclass(frozen=True, slots=True)
class LookupRecord:
    """One split this party owns: ``x[feature] <= threshold`` goes left (bin form: ``bin``)."""

    STORED_AS: ClassVar[str] = "workers.vertical.passive.LookupRecord"
    """Its name in checkpoints (it was defined in ``workers.vertical.passive``; it kept the name
    through ``workers.vertical.lookup`` and here, so every checkpoint written since loads)."""

    feature: int
    bin: int
    threshold: float
    missing_left: bool
    flip: bool = False
    """The split's children were shown to the active party in swapped order (the vertical
    forest, seed 002): its "left" child is this record's right one."""
    tree: int = -1
    depth: int = -1
    """The tree and level of the split (-1: a lookup file written before they were kept):
    path-mode prediction asks a record only at its level, one per tree and row."""


def records_go_left(x: np.ndarray, records: list[LookupRecord]) -> np.ndarray:
    """Per record and row, whether the row goes to the child the active party calls left
    (records x rows; ``x``: rows x this party's features)."""
    bits = np.zeros((len(records), x.shape[0]), dtype=bool)
    for k, r in enumerate(records):
        bits[k] = goes_left_raw(x[:, r.feature], r.threshold, r.missing_left) ^ r.flip
    return bits


def lookup_to_dict(party: str, job: str, names: tuple[str, ...],
                   records: dict[int, LookupRecord]) -> dict[str, Any]:
    """Versioned JSON form of a lookup table."""
    return {"format": LOOKUP_FORMAT, "version": LOOKUP_VERSION, "party": party, "job": job,
            "features": list(names),
            "records": {str(k): record_to_dict(r) for k, r in records.items()}}


def record_to_dict(r: LookupRecord) -> dict[str, Any]:
    """A lookup record as its file (and a forest's kept tree) holds it."""
    return {"feature": r.feature, "bin": r.bin, "threshold": r.threshold,
            "missing_left": r.missing_left, "flip": r.flip, "tree": r.tree, "depth": r.depth}


def record_from_dict(v: dict[str, Any]) -> LookupRecord:
    """A lookup record from its file form (files without tree and depth: -1)."""
    return LookupRecord(feature=int(v["feature"]), bin=int(v["bin"]),
                        threshold=float(v["threshold"]), missing_left=bool(v["missing_left"]),
                        flip=bool(v.get("flip", False)), tree=int(v.get("tree", -1)),
                        depth=int(v.get("depth", -1)))


def lookup_from_dict(raw: dict[str, Any]) -> tuple[tuple[str, ...], dict[int, LookupRecord]]:
    """Feature names and records of a lookup file."""
    if raw.get("format") != LOOKUP_FORMAT or raw.get("version") != LOOKUP_VERSION:
        raise ProtocolError(f"not a {LOOKUP_FORMAT} v{LOOKUP_VERSION} file")
    records = {int(k): record_from_dict(v) for k, v in raw["records"].items()}
    return tuple(raw["features"]), records
