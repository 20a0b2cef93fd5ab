"""Packing quantized (g, h) of one row into one Paillier plaintext.

A row's plaintext is ``[g + 2^bits | h | 1]`` in three slots: g shifted to be non-negative,
h (never negative) and a count of 1. Summing plaintexts of any set of up to ``max_rows`` rows
gives the three sums slot by slot without carries, because each slot is as wide as the largest
sum it can hold: the count ``ceil(log2(max_rows + 1))`` bits, h that many more than a value,
shifted g one more again. Unpacking removes the shift using the count, so the active party gets
the exact integer sums the plaintext histogram would have, plus the row count that
``min_samples_leaf`` needs.

Slots sized by what they hold, not all as wide as the widest, make a bin sum 127 bits instead of
174 at 10,000 rows: 16 bin sums travel per 2048-bit ciphertext instead of 11, and the passive
party's packing shifts (``cell_bits`` squarings per sum) and the key holder's decryptions shrink
by the same quarter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crypto import CryptoError, OverflowRiskError

SLOTS = 3


@dataclass(frozen=True, slots=True)
class GradientPacker:
    """Packs (g, h) with ``|g|, h <= 2**value_bits`` for sums over at most ``max_rows`` rows."""

    value_bits: int
    max_rows: int

    @property
    def count_bits(self) -> int:
        """Bits of the count slot: a count of up to max_rows."""
        return math.ceil(math.log2(self.max_rows + 1))

    @property
    def h_bits(self) -> int:
        """Bits of the h slot: up to max_rows values of at most 2**value_bits each."""
        return self.value_bits + self.count_bits

    @property
    def g_bits(self) -> int:
        """Bits of the (top) g slot: up to max_rows shifted values of at most 2**(value_bits+1)."""
        return self.value_bits + 1 + self.count_bits

    @property
    def cell_bits(self) -> int:
        """Bits of any sum of packed rows: each slot holds its own sum."""
        return self.g_bits + self.h_bits + self.count_bits

    def check_fits(self, n_bits: int) -> None:
        """Raise if three slots do not fit below n (plaintexts must stay < n)."""
        if self.cell_bits >= n_bits - 1:
            raise OverflowRiskError(
                f"{SLOTS} slots of {self.cell_bits} bits in all do not fit a {n_bits}-bit key"
            )

    def pack(self, g: Sequence[int] | npt.NDArray[np.integer[Any]],
             h: Sequence[int] | npt.NDArray[np.integer[Any]]) -> list[int]:
        """One plaintext per row."""
        c, w = self.count_bits, self.h_bits
        bound = 1 << self.value_bits
        out = []
        for gi, hi in zip(g, h, strict=True):
            gi, hi = int(gi), int(hi)
            if not (-bound <= gi <= bound and 0 <= hi <= bound):
                raise CryptoError("gradient or hessian outside the packer's range")
            out.append((((gi + bound) << w) | hi) << c | 1)
        return out

    def unpack_sum(self, packed: int) -> tuple[int, int, int]:
        """Sums (g, h, count) from the decrypted sum of packed rows."""
        c, w = self.count_bits, self.h_bits
        packed = int(packed)
        count = packed & ((1 << c) - 1)
        h = (packed >> c) & ((1 << w) - 1)
        g_shifted = packed >> (c + w)
        if count > self.max_rows or g_shifted >> self.g_bits:
            raise OverflowRiskError("packed sum overflowed its slots")
        return g_shifted - count * (1 << self.value_bits), h, count
