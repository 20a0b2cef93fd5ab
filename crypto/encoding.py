"""Packing quantized (g, h) of one row into one Paillier plaintext.

A row's plaintext is ``[g + 2^bits | h | 1]`` in three slots of ``slot_bits`` bits each: g
shifted to be non-negative, h (never negative) and a count of 1. Summing plaintexts of any set
of rows gives the three sums slot by slot without carries, because ``slot_bits`` leaves room
for ``log2(rows)`` extra bits. Unpacking removes the shift using the count, so the active party
gets the exact integer sums the plaintext histogram would have, plus the row count that
``min_samples_leaf`` needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from crypto import CryptoError, OverflowRiskError

SLOTS = 3


@dataclass(frozen=True, slots=True)
class GradientPacker:
    """Packs (g, h) with ``|g|, h <= 2**value_bits`` for sums over at most ``max_rows`` rows."""

    value_bits: int
    max_rows: int

    @property
    def slot_bits(self) -> int:
        """Bits per slot: a shifted value (value_bits + 1) times up to max_rows."""
        return self.value_bits + 2 + math.ceil(math.log2(self.max_rows + 1))

    @property
    def cell_bits(self) -> int:
        """Bits of any sum of packed rows: each slot holds its own sum."""
        return SLOTS * self.slot_bits

    def check_fits(self, n_bits: int) -> None:
        """Raise if three slots do not fit below n (plaintexts must stay < n)."""
        if SLOTS * self.slot_bits >= n_bits - 1:
            raise OverflowRiskError(
                f"{SLOTS} slots of {self.slot_bits} bits do not fit a {n_bits}-bit key"
            )

    def pack(self, g: Sequence[int], h: Sequence[int]) -> list[int]:
        """One plaintext per row."""
        w = self.slot_bits
        bound = 1 << self.value_bits
        out = []
        for gi, hi in zip(g, h, strict=True):
            gi, hi = int(gi), int(hi)
            if not (-bound <= gi <= bound and 0 <= hi <= bound):
                raise CryptoError("gradient or hessian outside the packer's range")
            out.append((((gi + bound) << w) | hi) << w | 1)
        return out

    def unpack_sum(self, packed: int) -> tuple[int, int, int]:
        """Sums (g, h, count) from the decrypted sum of packed rows."""
        w = self.slot_bits
        mask = (1 << w) - 1
        packed = int(packed)
        count = packed & mask
        h = (packed >> w) & mask
        g_shifted = packed >> (2 * w)
        if count > self.max_rows or g_shifted >> w:
            raise OverflowRiskError("packed sum overflowed its slots")
        return g_shifted - count * (1 << self.value_bits), h, count
