"""Packing g, h and a count into one plaintext: sums unpack exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import OverflowRiskError
from crypto.encoding import GradientPacker

BITS = 42


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-2**BITS, 2**BITS), st.integers(0, 2**BITS)),
                     min_size=1, max_size=200))
def test_sum_of_packed_rows_unpacks_to_exact_sums(rows: list[tuple[int, int]]) -> None:
    packer = GradientPacker(value_bits=BITS, max_rows=len(rows))
    packed = packer.pack([g for g, _ in rows], [h for _, h in rows])
    assert packer.unpack_sum(sum(packed)) == (sum(g for g, _ in rows), sum(h for _, h in rows), len(rows))


def test_homomorphic_sum_under_paillier(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    packer = GradientPacker(value_bits=BITS, max_rows=30_000)
    packer.check_fits(1024)
    g, h = [-(2**BITS), 5, 2**BITS], [0, 7, 2**BITS]
    cts = priv.encrypt_batch(packer.pack(g, h))
    total = pub.add(pub.add(cts[0], cts[1]), cts[2])
    assert packer.unpack_sum(priv.raw_decrypt(total)) == (sum(g), sum(h), 3)


def test_out_of_range_and_too_small_keys_are_rejected() -> None:
    packer = GradientPacker(value_bits=BITS, max_rows=10)
    with pytest.raises(ValueError):
        packer.pack([2**BITS + 1], [0])
    with pytest.raises(ValueError):
        packer.pack([0], [-1])
    with pytest.raises(OverflowRiskError):
        GradientPacker(value_bits=BITS, max_rows=2**20).check_fits(128)
