"""A party's table file read by its extension: CSV (text cells) or Parquet (typed columns).

Both give the same :class:`Table`: a header and, per column, either text cells or numbers, so
``workers.data`` validates and encodes them alike and a Parquet file gives the model its CSV
twin gives. Errors name the party and file, never a cell's value.
"""

from __future__ import annotations

import csv
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boosting._typing import FloatArray
from workers import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
"""Files with these extensions are read as Parquet; every other file as CSV."""

Cells = list[str]
"""A column as text, "" where a cell is empty (CSV) or null (Parquet)."""


class NumericColumn:
    """A Parquet numeric or boolean column, made float64 (NaN for nulls) only when read:
    converting all of a file's columns up front would hold a float64 copy of every column
    (400 MB at a million rows and 50 features) beside the features being filled."""

    __slots__ = ("_column",)

    def __init__(self, column: Any) -> None:
        self._column = column

    def __len__(self) -> int:
        return len(self._column)

    def numbers(self) -> FloatArray:
        """The column as float64, NaN where null."""
        return _floats(self._column)


@dataclass(frozen=True, slots=True)
class Table:
    """A file's header and columns. A column is text cells (every CSV column, Parquet strings)
    or numbers with NaN for nulls (Parquet numeric and boolean columns)."""

    header: list[str]
    columns: list[Cells | FloatArray | NumericColumn]
    first_row: int
    """The number errors give the first data row (CSV: 2, its line; Parquet: 1)."""
    integer: dict[int, Any] | None = None
    """Parquet integer columns as read (pyarrow arrays), by index: their text is exact digits
    (ids, categories), which float64 would round above 2^53."""

    @property
    def n_rows(self) -> int:
        """Data rows."""
        return len(self.columns[0]) if self.columns else 0


def is_parquet(path: Path | str) -> bool:
    """Whether ``path`` is read as Parquet (by its extension)."""
    return Path(path).suffix.lower() in PARQUET_SUFFIXES


def read_table(where: str, path: Path | str, rows: int | None = None) -> Table:
    """Read ``path`` as Parquet or CSV (by extension); ``where`` names party and file;
    ``rows``: only the first this-many data rows."""
    return _read_parquet(where, path, rows) if is_parquet(path) else _read_csv(where, path, rows)


def _read_csv(where: str, path: Path | str, limit: int | None) -> Table:
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            lines = csv.reader(handle)
            rows = list(lines if limit is None else itertools.islice(lines, limit + 1))
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
    for k, r in enumerate(body):
        if len(r) != len(header):
            raise DataError(f"{where}: row {k + 2} has {len(r)} fields, header has {len(header)}")
    columns: list[Cells | FloatArray | NumericColumn] = [[r[j] for r in body]
                                                         for j in range(len(header))]
    return Table(header=header, columns=columns, first_row=2)


def _read_parquet(where: str, path: Path | str, limit: int | None) -> Table:
    import pyarrow as pa  # only Parquet files pay for importing it
    import pyarrow.parquet as pq

    if not Path(path).exists():
        raise DataError(f"{where}: not found")
    try:
        if limit is None:
            table = pq.read_table(path)
        else:
            parquet = pq.ParquetFile(path)
            first = next(parquet.iter_batches(batch_size=max(limit, 1)), None)
            table = (pa.Table.from_batches([first]) if first is not None
                     else parquet.schema_arrow.empty_table())
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{where}: cannot read as Parquet ({type(exc).__name__})") from None
    header = [str(name).strip() for name in table.column_names]
    columns: list[Cells | FloatArray | NumericColumn] = []
    integer: dict[int, Any] = {}
    for j, (name, column) in enumerate(zip(header, table.columns)):
        kind = column.type
        if pa.types.is_dictionary(kind):
            column, kind = column.cast(kind.value_type), kind.value_type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            columns.append(["" if v is None else v for v in column.to_pylist()])
        elif pa.types.is_integer(kind):
            integer[j] = column
            columns.append(NumericColumn(column))
        elif pa.types.is_floating(kind) or pa.types.is_boolean(kind) or \
                pa.types.is_decimal(kind):
            columns.append(NumericColumn(column))
        else:
            raise DataError(f"{where}: column {name!r} has Parquet type {kind}: expected "
                            f"numbers, booleans or text")
    if not header:
        raise DataError(f"{where}: empty file")
    return Table(header=header, columns=columns, first_row=1, integer=integer)


def release_arrow_memory() -> None:
    """Hand memory Arrow freed back to the system: its pool (mimalloc or jemalloc) otherwise
    keeps a Parquet file's buffers resident after the table is gone (a no-op if no Parquet
    file was read)."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


def _floats(column: Any) -> FloatArray:
    import pyarrow as pa
    import pyarrow.compute as pc

    # unsafe: integers above 2^53 round, as any float64 feature does (ids keep their text)
    filled = pc.fill_null(column.cast(pa.float64(), safe=False), float("nan"))
    return np.asarray(filled.to_numpy(), dtype=np.float64)


def column_text(table: Table, j: int, where: str, what: str) -> Cells:
    """Column ``j`` as text (ids, categories): text cells as they are, Parquet integers as
    their digits; a float column is an error (``1.0`` and ``1`` would differ)."""
    column = table.columns[j]
    if isinstance(column, list):
        return column
    if table.integer and j in table.integer:
        return ["" if v is None else str(v) for v in table.integer[j].to_pylist()]
    raise DataError(f"{where}: {what} {table.header[j]!r} holds floating-point numbers: "
                    f"expected text or integers")
