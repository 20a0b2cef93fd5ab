"""Exact gradient histograms (numba).

Gradients arrive quantized to int64 (see ``fixedpoint``), so histogram sums are exact and
independent of row order: the same sums come out of the centralized kernel, of a passive
party's encrypted accumulation after decryption, and of histogram subtraction.
"""

from __future__ import annotations

import numba
import numpy as np

from boosting._typing import BinMatrix, Histogram, IntArray


@numba.njit(cache=True, nogil=True)
def _accumulate(bins, slot_of_row, g, h, n_slots, n_bins):  # type: ignore[no-untyped-def]  # numba
    # types the arguments itself, when it compiles the kernel
    n_rows, n_features = bins.shape
    out = np.zeros((n_slots, n_features, n_bins, 3), dtype=np.int64)
    for i in range(n_rows):
        s = slot_of_row[i]
        if s < 0:
            continue
        gi = g[i]
        hi = h[i]
        for j in range(n_features):
            b = bins[i, j]
            out[s, j, b, 0] += gi
            out[s, j, b, 1] += hi
            out[s, j, b, 2] += 1
    return out


def build_histograms(
    bins: BinMatrix, slot_of_row: IntArray, g: IntArray, h: IntArray, n_slots: int, max_bin: int
) -> Histogram:
    """Histograms for ``n_slots`` nodes in one pass; rows with slot -1 are skipped.

    Returns an array (slots, features, max_bin + 1, 3) of sums of g, h and row counts.
    """
    sums: Histogram = _accumulate(  # numba's dispatcher: untyped to mypy
        np.ascontiguousarray(bins),
        np.ascontiguousarray(slot_of_row, dtype=np.int64),
        np.ascontiguousarray(g, dtype=np.int64),
        np.ascontiguousarray(h, dtype=np.int64),
        n_slots,
        max_bin + 1,
    )
    return sums
