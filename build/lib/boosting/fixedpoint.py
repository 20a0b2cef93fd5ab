"""Fixed-point quantization of gradients and hessians.

Both trainers quantize g and h with the same scale before building histograms, so every sum is
an exact integer: encrypted sums decrypt to exactly what the centralized trainer computes, and
the resulting trees are identical, not merely close. With ``bits`` fractional bits per tree
(about 42 for up to a million rows) the rounding error is ~1e-13 relative, far below 1e-6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from boosting import BoostingError
from boosting._typing import FloatArray, IntArray

# Sums over all rows must fit in int64 (63 bits): magnitude bits + log2(rows) <= 62.
_INT64_BUDGET = 62
MAX_VALUE_BITS = 42


def value_bits(n_rows: int) -> int:
    """Magnitude bits per quantized value such that a sum over ``n_rows`` fits in int64."""
    bits = min(MAX_VALUE_BITS, _INT64_BUDGET - max(1, math.ceil(math.log2(n_rows + 1))))
    if bits < 24:
        raise BoostingError(f"{n_rows} rows are too many for exact int64 histogram sums")
    return bits


@dataclass(frozen=True, slots=True)
class Quantized:
    """Integers ``round(values * scale)`` with ``|ints| <= 2**bits``."""

    ints: IntArray
    scale: float
    bits: int


def quantize(values: FloatArray, n_rows: int) -> Quantized:
    """Quantize with a power-of-two scale chosen from the largest magnitude."""
    return quantize_at(values, n_rows, peak_exponent(values))


def peak_exponent(values: FloatArray) -> int:
    """The exponent ``e`` with ``max|values| < 2**e`` (0 for no or zero values): the one number
    about the values that the scale depends on (horizontal members agree on the largest)."""
    peak = float(np.max(np.abs(values))) if values.size else 0.0
    if not math.isfinite(peak):
        raise BoostingError("gradients are not finite; check labels and learning rate")
    return math.frexp(peak)[1] if peak > 0 else 0  # peak < 2**exponent


def quantize_at(values: FloatArray, n_rows: int, exponent: int) -> Quantized:
    """Quantize with the scale of :func:`quantize` for ``n_rows`` rows whose peak exponent is
    ``exponent`` (every value's magnitude must be below ``2**exponent``)."""
    bits = value_bits(n_rows)
    scale = math.ldexp(1.0, bits - exponent)
    ints = np.rint(values * scale).astype(np.int64)
    return Quantized(ints=ints, scale=scale, bits=bits)
