"""Loading a party's CSV file with errors that name the party, file, row and column.

The errors go back to the flow (and so to Prefect, where others may read them): they name rows,
columns and files, never an id or a cell's value; those are logged here, at DEBUG, for the
party's own operator.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boosting._typing import FloatArray
from workers import DataError

log = logging.getLogger("fedboost.worker")

_MISSING = {"", "na", "nan", "null", "none", "?"}


@dataclass(frozen=True, slots=True)
class PartyData:
    """A party's rows: string ids, feature names and values, and the label if it holds one."""

    ids: list[str]
    names: tuple[str, ...]
    x: FloatArray
    y: FloatArray | None


def load_party_csv(party: str, path: Path | str, id_column: str, label: str | None,
                   *, require_label: bool, columns: list[str] | None = None) -> PartyData:
    """Read and validate one party's file.

    Empty cells and NA/NaN are missing values; anything else must parse as a number.
    ``columns`` restricts the features to those named (in that order).
    """
    where = f"party {party}: file {path}"
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except FileNotFoundError:
        raise DataError(f"{where}: not found") from None
    except UnicodeDecodeError as exc:  # its text quotes the undecodable bytes
        raise DataError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DataError(f"{where}: cannot read ({exc.strerror or type(exc).__name__})") from None
    except csv.Error as exc:
        raise DataError(f"{where}: cannot read ({exc})") from None
    if not rows:
        raise DataError(f"{where}: empty file")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r]
    if id_column not in header:
        raise DataError(f"{where}: no id column {id_column!r} (columns: {', '.join(header)})")
    if label is not None and label not in header and require_label:
        raise DataError(f"{where}: no label column {label!r} (columns: {', '.join(header)})")
    for k, r in enumerate(body):
        if len(r) != len(header):
            raise DataError(f"{where}: row {k + 2} has {len(r)} fields, header has {len(header)}")
    if not body:
        raise DataError(f"{where}: no data rows")
    id_at = header.index(id_column)
    ids = [r[id_at].strip() for r in body]
    _check_ids(where, ids)
    label_at = header.index(label) if label is not None and label in header else -1
    feature_at = [j for j in range(len(header)) if j not in (id_at, label_at)]
    if columns is not None:
        absent = [c for c in columns if c not in header]
        if absent:
            raise DataError(f"{where}: no feature column(s) {', '.join(absent)}")
        feature_at = [header.index(c) for c in columns]
        if id_at in feature_at or label_at in feature_at:
            raise DataError(f"{where}: the id or label column cannot be a feature")
    if not feature_at:
        raise DataError(f"{where}: no feature columns")
    x = np.empty((len(body), len(feature_at)))
    for k, j in enumerate(feature_at):
        x[:, k] = _numeric_column(where, header[j], [r[j] for r in body])
    y = _numeric_column(where, header[label_at], [r[label_at] for r in body]) if label_at >= 0 else None
    if y is not None and np.isnan(y).any():
        row = int(np.flatnonzero(np.isnan(y))[0]) + 2
        raise DataError(f"{where}: row {row}, label column {label!r} is empty")
    return PartyData(ids=ids, names=tuple(header[j] for j in feature_at), x=x, y=y)


def _check_ids(where: str, ids: list[str]) -> None:
    first: dict[str, int] = {}
    for k, ident in enumerate(ids):
        if not ident:
            raise DataError(f"{where}: row {k + 2} has an empty id")
        if ident in first:
            log.debug("%s: duplicate id %r", where, ident)
            raise DataError(f"{where}: duplicate id at rows {first[ident] + 2} and {k + 2}")
        first[ident] = k


def _numeric_column(where: str, name: str, cells: list[str]) -> FloatArray:
    cleaned = ["nan" if c.strip().lower() in _MISSING else c.strip() for c in cells]
    try:
        values = np.array(cleaned, dtype=np.float64)
    except ValueError:
        for k, c in enumerate(cleaned):
            try:
                float(c)
            except ValueError:
                log.debug("%s: row %d, column %r: %r", where, k + 2, name, c)
                raise DataError(f"{where}: row {k + 2}, column {name!r}: not a number") from None
        raise
    if np.isinf(values).any():
        row = int(np.flatnonzero(np.isinf(values))[0]) + 2
        raise DataError(f"{where}: row {row}, column {name!r}: infinite value")
    return values
