"""Loading a party's data file (CSV or Parquet) with errors that name the party, file, row and
column; columns declared categorical are encoded here, by the party that owns them.

The errors go back to the flow (and so to Prefect, where others may read them): they name rows,
columns and files, never an id or a cell's value; those are logged here, at DEBUG, for the
party's own operator.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from boosting._typing import FloatArray
from boosting.tree import write_json_atomic
from workers import DataError
from workers.tables import NumericColumn, column_text, read_table, release_arrow_memory
from workers.model_folder import ModelPart

log = logging.getLogger("fedboost.worker")

_MISSING = {"", "na", "nan", "null", "none", "?"}


@dataclass(frozen=True, slots=True)
class PartyData:
    """A party's rows: string ids, feature names and values, and the label if it holds one."""

    ids: list[str]
    names: tuple[str, ...]
    x: FloatArray
    y: FloatArray | None
    categories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per categorical feature, the categories its codes (0, 1, ...) stand for."""

    def labels(self) -> FloatArray:
        """``y``, for a party that must hold labels (a DataError if it holds none)."""
        if self.y is None:
            raise DataError(f"{len(self.ids)} rows without a label column")
        return self.y


def load_party_data(party: str, path: Path | str, id_column: str, label: str | None,
                    *, require_label: bool, columns: list[str] | None = None,
                    categorical: list[str] | None = None,
                    categories: Mapping[str, Sequence[str]] | None = None,
                    rows: int | None = None, objective: str | None = None) -> PartyData:
    """Read and validate one party's file: Parquet (``.parquet``, ``.pq``) or CSV.

    Empty cells, nulls and NA/NaN are missing values; anything else must be a number, except in
    columns declared ``categorical``, which this party encodes itself (:func:`encode_categories`).
    ``categories`` gives such columns fixed codes (a saved model part's: prediction codes rows
    as training did). ``columns`` restricts the features to those named (in that order).
    ``rows`` reads only the first this-many rows (a quick check of a file before a job).
    ``objective`` (a training job's) checks every label is one of its values (binary: 0 or 1;
    multiclass: a class number), naming the first row that is not: before any party's time
    goes into PSI and binning.
    """
    where = f"party {party}: file {path}"
    table = read_table(where, path, rows)
    header = table.header
    if id_column not in header:
        raise DataError(f"{where}: no id column {id_column!r} (columns: {', '.join(header)})")
    if label is not None and label not in header and require_label:
        raise DataError(f"{where}: no label column {label!r} (columns: {', '.join(header)})")
    if table.n_rows == 0:
        raise DataError(f"{where}: no data rows")
    id_at = header.index(id_column)
    ids = [i.strip() for i in column_text(table, id_at, where, "id column")]
    _check_ids(where, ids, table.first_row)
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
    fixed = {name: tuple(values) for name, values in (categories or {}).items()}
    declared = set(categorical or ()) | set(fixed)
    strays = sorted(declared - {header[j] for j in feature_at})
    if strays:
        raise DataError(f"{where}: categorical column(s) {', '.join(strays)} are not among "
                        f"this party's feature columns")
    x = np.empty((table.n_rows, len(feature_at)))
    encoded: dict[str, tuple[str, ...]] = {}
    for k, j in enumerate(feature_at):
        name = header[j]
        if name in declared:
            x[:, k], encoded[name] = encode_categories(
                column_text(table, j, where, "categorical column"), fixed.get(name))
        else:
            x[:, k] = _numeric_column(where, name, table.columns[j], table.first_row,
                                      feature=True)
    y = None
    if label_at >= 0:
        y = _numeric_column(where, header[label_at], table.columns[label_at], table.first_row,
                            feature=False).copy()  # not a view of Arrow's buffer
    first_row = table.first_row
    del table
    release_arrow_memory()
    if y is not None and np.isnan(y).any():
        row = int(np.flatnonzero(np.isnan(y))[0]) + first_row
        raise DataError(f"{where}: row {row}, label column {label!r} is empty")
    if y is not None and objective is not None:
        _check_label_values(where, label, y, objective, first_row)
    return PartyData(ids=ids, names=tuple(header[j] for j in feature_at), x=x, y=y,
                     categories=encoded)


def encode_categories(cells: list[str],
                      known: tuple[str, ...] | None = None) -> tuple[FloatArray, tuple[str, ...]]:
    """Codes of a categorical column and the categories they index.

    Without ``known`` (training) the categories are the column's distinct values, sorted, so
    the codes depend on this party's file alone and are the same in every run; with ``known``
    (a saved model part's, for prediction) a value not among them is missing, as are empty and
    NA cells. Trees split the codes like numbers (``code <= t``).
    """
    values = [c.strip() for c in cells]
    present = [v for v in values if v.lower() not in _MISSING]
    chosen = known if known is not None else tuple(sorted(set(present)))
    code = {v: float(k) for k, v in enumerate(chosen)}
    return np.array([code.get(v, np.nan) for v in values], dtype=np.float64), chosen


def _check_label_values(where: str, label: str | None, y: FloatArray, objective: str,
                        first_row: int) -> None:
    """Every label a value of ``objective``: binary 0 or 1, multiclass 0..K-1 (integers);
    regression any finite number."""
    if objective == "binary":
        wrong, expected = ~np.isin(y, (0.0, 1.0)), "0 or 1 (objective binary)"
    elif objective == "multiclass":
        wrong = (y != np.round(y)) | (y < 0) | ~np.isfinite(y)
        expected = "a class number 0, 1, 2, ... (objective multiclass)"
    else:
        wrong, expected = ~np.isfinite(y), "a finite number (objective regression)"
    if wrong.any():
        k = int(np.flatnonzero(wrong)[0])
        raise DataError(f"{where}: row {k + first_row}, label column {label!r}: {y[k]:g} is "
                        f"not {expected}; {int(wrong.sum())} row(s) like it")


def _check_ids(where: str, ids: list[str], first_row: int) -> None:
    first: dict[str, int] = {}
    for k, ident in enumerate(ids):
        if not ident:
            raise DataError(f"{where}: row {k + first_row} has an empty id")
        if ident in first:
            log.debug("%s: duplicate id %r", where, ident)
            raise DataError(f"{where}: duplicate id at rows {first[ident] + first_row} and "
                            f"{k + first_row}")
        first[ident] = k


def _numeric_column(where: str, name: str, column: list[str] | FloatArray | NumericColumn,
                    first_row: int, *, feature: bool) -> FloatArray:
    if isinstance(column, NumericColumn):
        values = column.numbers()
    elif isinstance(column, np.ndarray):
        values = column
    else:
        values = _parse_numbers(where, name, column, first_row, feature)
    if np.isinf(values).any():
        row = int(np.flatnonzero(np.isinf(values))[0]) + first_row
        raise DataError(f"{where}: row {row}, column {name!r}: infinite value")
    return values


def _parse_numbers(where: str, name: str, cells: list[str], first_row: int,
                   feature: bool) -> FloatArray:
    cleaned = ["nan" if c.strip().lower() in _MISSING else c.strip() for c in cells]
    try:
        return np.array(cleaned, dtype=np.float64)
    except ValueError:
        pass
    for k, c in enumerate(cleaned):
        try:
            float(c)
        except ValueError:
            log.debug("%s: row %d, column %r: %r", where, k + first_row, name, c)
            hint = (f"; a column of text must be declared 'categorical: [{name}]' (this party "
                    f"encodes it) or dropped" if feature else "")
            raise DataError(f"{where}: row {k + first_row}, column {name!r}: not a "
                            f"number{hint}") from None
    raise DataError(f"{where}: column {name!r}: not numbers")


CATEGORIES_FORMAT = "fedboost-categories"
CATEGORIES_VERSION = 1


def save_categories(folder: Path, categories: Mapping[str, Sequence[str]]) -> None:
    """Keep the codes of this party's categorical features with its model part (none: no
    file, and a stale one from an earlier run of the job is removed)."""
    path = ModelPart(folder).categories  # only this party holds them: prediction codes as training
    if not categories:
        path.unlink(missing_ok=True)
        return
    write_json_atomic(path, {"format": CATEGORIES_FORMAT, "version": CATEGORIES_VERSION,
                             "columns": {k: list(v) for k, v in categories.items()}})


def load_categories(folder: Path) -> dict[str, tuple[str, ...]]:
    """The categories saved with the model part in ``folder`` (none: an empty mapping)."""
    path = ModelPart(folder).categories
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    columns = raw.get("columns") if isinstance(raw, dict) else None
    if raw.get("format") != CATEGORIES_FORMAT or raw.get("version") != CATEGORIES_VERSION or \
            not isinstance(columns, dict) or not all(
                isinstance(v, list) and all(isinstance(c, str) for c in v)
                for v in columns.values()):
        raise DataError(f"{path}: not a {CATEGORIES_FORMAT} v{CATEGORIES_VERSION} file")
    return {str(k): tuple(v) for k, v in columns.items()}
