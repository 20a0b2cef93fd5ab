"""Shared cuts from securely summed counts on a public grid: no member's value leaves it.

Every member bins its rows with the same cuts. A member sends no value, no summary and no
histogram of its own: it counts its non-missing values per cell of a public grid and masks the
counts (``workers.pairwise_masks``), so the aggregator sees only the sum over all members,
the union's counts. From those alone it decides which cells to split for the next round, and
in the end cuts at cell edges where the union's quantiles lie. The reference
(``fedboost.joined.pool_members``) runs the same rounds (:func:`union_cuts`) on the pooled rows,
so it bins with the federation's cuts.

The grid. Cells are right-closed, ``(lower, upper]`` like bins (``boosting.binning``); a
feature's :class:`Layout` is its ascending list of upper edges, the last ``+inf``. Round 0
(``COARSE``) has the same cells for every feature: one per power of two of either sign,
``(2^e, 2^(e+1)]`` and ``(-2^(e+1), -2^e]`` for ``-64 <= e < 63``, ``(-2^-64, 0]`` (zero),
``(0, 2^-64]``, and the two unbounded ends past ``2^63`` in magnitude. A split cuts a cell into
``SPLIT`` equal cells, so every edge is a dyadic number, exact in float64, and a cell after
``MAX_ROUNDS - 1`` splits is ``2^-8`` of its power of two: the public floor. No cell is ever
narrower, whoever's values it holds (a relative width of at least ``2^-9`` of its larger edge's
magnitude). The cells ending at 0 and the unbounded ones are never split.

Which cells are split (:func:`cells_to_split`), from the union's counts of one feature:

* at most ``max_bin`` occupied cells ("few values"): every cell holding more than one row,
  every round, so that distinct values end in cells of their own (integers of magnitude at most
  ``2^8`` always do); a cell of one row holds one value already, and splitting it would only
  tell the members where that one row lies;
* otherwise the cells holding a target rank of ``np.quantile(..., method="inverted_cdf")`` at
  ``i / max_bin``, while such a cell holds more than ``rows / size`` of the feature's rows and
  more than one.

Cuts (:func:`grid_cuts`), by the rules of ``boosting.binning.quantile_cuts``: with at most
``max_bin`` occupied cells one bin per occupied cell, cut between two of them at the coarsest
edge in the gap (the edge made in the earliest round, the middle one of those); otherwise the
upper edge of the cell holding each target rank, below the last occupied cell's upper edge.

What the parties learn. The aggregator: per round, the union's count in every cell (nothing of
one member). The members: the cells split each round (which cells of the union hold a quantile,
or hold any value when there are few) and the cuts, which are edges of those cells. Raw values
never travel; the union's quantiles are placed within a cell, and a feature of few values has
the cells of its values known to the aggregator and separated by coarse edges for the members.
A member that holds no value in a cell the union split learns that other members' rows lie
there: to the floor (``2^-8`` of the power of two), never finer (it was ``2^-20`` before issue
36; cut quality, measured on default_credit_homo, is the same: docs/horizontal.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boosting._typing import FloatArray, IntArray
from workers import DataError, ProtocolError

SPLIT = 16
"""Cells one split makes of a cell: 16 equal parts (4 more bits of the value per round)."""
MAX_ROUNDS = 3
"""Counting rounds: the coarse grid and up to two splits, so no cell is narrower than the
public floor of ``2^-8`` of its power of two (issue 36: six rounds, ``2^-20``, placed other
members' values to 6 digits; the test AUC on default_credit_homo is the same or better)."""
MAX_CELLS = 1 << 16
"""Cells one feature may have; the rules above make at most 258 + 2 * 15 * max_bin."""
_OCTAVES = 2.0 ** np.arange(-64, 64)
COARSE = np.concatenate([-_OCTAVES[::-1], [0.0], _OCTAVES, [np.inf]])
"""Round 0's upper edges, the same for every feature (258 cells)."""


class GridError(ProtocolError, ValueError):
    """A grid message is malformed: cells that do not exist or cannot be split, bad counts."""


@dataclass(frozen=True, slots=True)
class Layout:
    """One feature's cells: ascending upper edges (the last ``+inf``) and the round in which
    each edge was made (0 for the coarse grid's)."""

    edges: FloatArray
    born: IntArray

    @classmethod
    def coarse(cls) -> Layout:
        """Round 0's cells."""
        return cls(COARSE.copy(), np.zeros(COARSE.size, dtype=np.int64))

    @property
    def size(self) -> int:
        """The number of cells."""
        return int(self.edges.size)

    def count(self, column: FloatArray) -> IntArray:
        """Non-missing values of ``column`` per cell."""
        values = column[~np.isnan(column)]
        cells = np.searchsorted(self.edges, values, side="left")
        return np.bincount(cells, minlength=self.edges.size).astype(np.int64)

    def splittable(self) -> np.ndarray:
        """Cells that may be split: bounded, and not ending at zero."""
        lower = np.concatenate([[-np.inf], self.edges[:-1]])
        return np.isfinite(lower) & np.isfinite(self.edges) & (self.edges != 0.0)

    def split(self, cells: IntArray, round_: int) -> Layout:
        """The layout with ``cells`` cut into ``SPLIT`` equal cells each (edges of round
        ``round_``).

        Raises
        ------
        GridError
            If the cells are not ascending, distinct, existing and splittable, or the feature
            would have more than ``MAX_CELLS`` cells.
        """
        if cells.size == 0:
            return self
        if not ((np.diff(cells) > 0).all() and 0 <= cells[0] and cells[-1] < self.size):
            raise GridError(f"cells to split must be ascending, distinct and below {self.size}")
        if not self.splittable()[cells].all():
            raise GridError("cells to split include an unbounded cell or the one ending at 0")
        if self.size + cells.size * (SPLIT - 1) > MAX_CELLS:
            raise GridError(f"splitting {cells.size} cells would pass {MAX_CELLS} cells")
        lower, upper = self.edges[cells - 1], self.edges[cells]
        steps = np.arange(1, SPLIT, dtype=np.float64) / SPLIT
        new = (lower[:, None] + (upper - lower)[:, None] * steps).ravel()
        edges = np.concatenate([self.edges, new])
        born = np.concatenate([self.born, np.full(new.size, round_, dtype=np.int64)])
        order = np.argsort(edges, kind="stable")
        return Layout(edges[order], born[order])


def inverted_cdf_ranks(n: int, probs: FloatArray) -> IntArray:
    """0-based ranks that ``np.quantile(a, probs, method="inverted_cdf")`` reads from ``n``
    sorted values, with numpy's own float arithmetic (so ties at ``n * p`` integer agree)."""
    index = n * probs - 1
    previous = np.floor(index)
    ranks = np.where(index - previous == 0, previous, previous + 1).astype(np.int64)
    ranks[ranks < 0] = 0
    return ranks


def _quantile_cells(counts: IntArray, max_bin: int) -> IntArray:
    """The cells holding the ranks ``quantile_cuts`` reads at ``i / max_bin``."""
    probs = np.arange(1, max_bin, dtype=np.float64) / max_bin
    ranks = inverted_cdf_ranks(int(counts.sum()), probs)
    cells: IntArray = np.searchsorted(np.cumsum(counts), ranks, side="right")
    return cells


def cells_to_split(layout: Layout, counts: IntArray, size: int, max_bin: int) -> IntArray:
    """The cells of one feature to split next round (module docstring), from the union's
    counts in its cells."""
    rows = int(counts.sum())
    occupied = counts > 0
    if rows == 0:
        return np.empty(0, dtype=np.int64)
    if occupied.sum() <= max_bin:
        wanted = counts > 1  # a cell of one row holds one value: nothing to separate
    else:
        wanted = np.zeros(counts.size, dtype=bool)
        wanted[_quantile_cells(counts, max_bin)] = True
        wanted &= (counts > 1) & (counts * size > rows)
    return np.flatnonzero(wanted & layout.splittable()).astype(np.int64)


def _separator(layout: Layout, below: int, above: int) -> float:
    """The coarsest edge between occupied cells ``below < above``: among the upper edges of
    cells ``below .. above - 1``, those made in the earliest round, the middle one."""
    edges, born = layout.edges[below:above], layout.born[below:above]
    coarsest = edges[born == born.min()]
    return float(coarsest[coarsest.size // 2])


def grid_cuts(layout: Layout, counts: IntArray, max_bin: int) -> FloatArray:
    """One feature's cuts from the union's counts in its final cells (module docstring): at
    most ``max_bin`` ascending cuts ending with ``+inf``, every inner one a finite edge."""
    occupied = np.flatnonzero(counts)
    if occupied.size == 0:
        return np.array([np.inf])
    if occupied.size <= max_bin:
        inner = np.array([_separator(layout, a, b) for a, b in zip(occupied[:-1], occupied[1:])],
                         dtype=np.float64)
    else:
        inner = np.unique(layout.edges[_quantile_cells(counts, max_bin)])
        inner = inner[inner < layout.edges[occupied[-1]]]
    return np.concatenate([inner, [np.inf]])


def check_counts(counts: IntArray, rows_limit: int, where: str) -> None:
    """Refuse summed counts that no rows could give (a member that did not mask or count as
    the protocol says): negative, or more than ``rows_limit`` in all."""
    if (counts < 0).any() or int(counts.sum()) > rows_limit:
        raise GridError(f"{where}: the summed cell counts are not counts of at most "
                        f"{rows_limit} rows")


@dataclass(slots=True)
class GridRounds:
    """Where the set-up stands: every feature's layout and the round (the aggregator's, and
    the reference's in :func:`union_cuts`)."""

    size: int
    max_bin: int
    layouts: list[Layout]
    round: int = 0

    @classmethod
    def start(cls, n_features: int, size: int, max_bin: int) -> GridRounds:
        """Round 0: every feature on the coarse grid."""
        return cls(size, max_bin, [Layout.coarse() for _ in range(n_features)])

    def cells(self) -> list[int]:
        """Cells per feature this round (the layout of a member's count vector)."""
        return [layout.size for layout in self.layouts]

    def unflatten(self, flat: IntArray) -> list[IntArray]:
        """One count vector per feature from the concatenated ones."""
        return np.split(flat, np.cumsum(self.cells())[:-1])

    def advance(self, counts: list[IntArray]) -> list[IntArray] | None:
        """The cells to split for the next round (and split them here), or None when the
        counts of this round are the last (no cell to split, or ``MAX_ROUNDS`` reached)."""
        if self.round + 1 >= MAX_ROUNDS:
            return None
        chosen = [cells_to_split(layout, c, self.size, self.max_bin)
                  for layout, c in zip(self.layouts, counts, strict=True)]
        if not any(c.size for c in chosen):
            return None
        self.round += 1
        self.layouts = [layout.split(c, self.round) for layout, c in zip(self.layouts, chosen)]
        return chosen

    def cuts(self, counts: list[IntArray]) -> list[FloatArray]:
        """Every feature's cuts from the last round's counts."""
        return [grid_cuts(layout, c, self.max_bin)
                for layout, c in zip(self.layouts, counts, strict=True)]

    def bin_counts(self, counts: list[IntArray], cuts: list[FloatArray], rows: int) -> IntArray:
        """The union's rows per bin of ``cuts`` (features x ``max_bin + 1``, the last column
        the missing values, ``rows`` less the counted ones), from the last round's counts:
        every cut is a cell's upper edge, so each cell lies in one bin."""
        out = np.zeros((len(cuts), self.max_bin + 1), dtype=np.int64)
        for j, (layout, c, edges) in enumerate(zip(self.layouts, counts, cuts, strict=True)):
            bins = np.searchsorted(edges, layout.edges, side="left")  # as apply_cuts bins
            out[j, :self.max_bin] = np.bincount(bins, weights=c, minlength=self.max_bin)
            out[j, self.max_bin] = rows - int(c.sum())
        return out


def count_columns(x: FloatArray, layouts: list[Layout]) -> IntArray:
    """A member's counts of every feature's cells, concatenated (rows x features ``x``).

    Raises
    ------
    DataError
        If ``x`` is not 2-d, holds +/-inf, or has another number of columns than layouts.
    """
    if x.ndim != 2 or x.shape[1] != len(layouts):
        raise DataError(f"expected a rows x {len(layouts)} feature matrix, got shape {x.shape}")
    if np.isinf(x).any():
        raise DataError("features contain +/-inf; replace them by NaN (missing) or values")
    if not layouts:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([layout.count(x[:, j]) for j, layout in enumerate(layouts)])


def union_cuts(x: FloatArray, size: int, max_bin: int) -> list[FloatArray]:
    """The cuts a federation whose rows together are ``x`` agrees on (the same rounds, with
    the union's counts computed in one place): the lossless reference's cuts."""
    rounds = GridRounds.start(x.shape[1], size, max_bin)
    while True:
        counts = rounds.unflatten(count_columns(x, rounds.layouts))
        if rounds.advance(counts) is None:
            return rounds.cuts(counts)
