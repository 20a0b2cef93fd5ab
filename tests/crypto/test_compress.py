"""Packing bin sums several per ciphertext: the key holder gets exactly the per-bin sums."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import CryptoError, OverflowRiskError
from crypto._gmp import mpz
from crypto.compress import BinSumPacking, decrypt_bin_sums, pack_bin_sums
from crypto.encoding import GradientPacker
from crypto.paillier import (
    PaillierPrivateKey,
    PaillierPublicKey,
    ciphertexts_from_bytes,
    ciphertexts_to_bytes,
    generate_keypair,
)

BITS = 42  # value bits at up to a million rows (boosting.fixedpoint)
Cell = tuple[int, int, int]  # (sum of g, sum of h, count)


@st.composite
def bin_sums(draw: st.DrawFn, max_rows: int) -> Cell:
    """A bin's (g, h, count) as summing up to max_rows packed rows can give, extremes included."""
    count = draw(st.integers(0, max_rows) | st.sampled_from([0, 1, max_rows]))
    bound = count << BITS
    g = draw(st.integers(-bound, bound) | st.sampled_from([-bound, bound]))
    h = draw(st.integers(0, bound) | st.just(bound))
    return g, h, count


def _encrypt_bin(private: PaillierPrivateKey, packer: GradientPacker, cell: Cell) -> mpz:
    """E of the bin's packed sum, or the trivial ciphertext 1 for an empty bin (as sent)."""
    g, h, count = cell
    if count == 0:
        return mpz(1)
    c, w = packer.count_bits, packer.h_bits
    plain = ((g + (count << BITS)) << (w + c)) | (h << c) | count  # the sum of count packed rows
    return private.encrypt_batch([plain])[0]


def _round_trip(public: PaillierPublicKey, private: PaillierPrivateKey, packer: GradientPacker,
                cells: list[Cell]) -> tuple[list[bool], list[Cell]]:
    """Passive side packs the histogram's bytes; key holder decrypts, cuts and unpacks."""
    packing = BinSumPacking.for_key(packer.cell_bits, public.n.bit_length())
    blob = ciphertexts_to_bytes([_encrypt_bin(private, packer, c) for c in cells], public)
    filled, packed = pack_bin_sums(blob, public, packing)
    sums = packing.unpack(private.decrypt_batch(ciphertexts_from_bytes(packed, public)),
                          sum(filled))
    return filled, [packer.unpack_sum(m) for m in sums]


@pytest.fixture(scope="module")
def keypair_512() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    """Room for only two sums per ciphertext: many short last runs."""
    return generate_keypair(512)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), max_rows=st.integers(1, 30_000) | st.just(30_000))
def test_packed_sums_unpack_to_exactly_the_bin_sums(keypair_1024, keypair_512,  # type: ignore[no-untyped-def]
                                                    data: st.DataObject, max_rows: int) -> None:
    # Prepare
    public, private = data.draw(st.sampled_from([keypair_1024, keypair_512]))
    packer = GradientPacker(value_bits=BITS, max_rows=max_rows)
    cells = data.draw(st.lists(bin_sums(max_rows), max_size=40))
    # Execute
    filled, sums = _round_trip(public, private, packer, cells)
    # Assert
    assert filled == [count > 0 for _, _, count in cells]
    assert sums == [c for c in cells if c[2] > 0]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), max_rows=st.integers(1, 30_000) | st.just(30_000))
def test_the_key_holders_fold_gives_the_senders_sums(keypair_1024, keypair_512,  # type: ignore[no-untyped-def]
                                                      data: st.DataObject, max_rows: int) -> None:
    # Prepare: bin sums sent one per ciphertext, empty bins left out as the sender does
    public, private = data.draw(st.sampled_from([keypair_1024, keypair_512]))
    packer = GradientPacker(value_bits=BITS, max_rows=max_rows)
    packing = BinSumPacking.for_key(packer.cell_bits, public.n.bit_length())
    cells = [c for c in data.draw(st.lists(bin_sums(max_rows), max_size=40)) if c[2] > 0]
    sent = [_encrypt_bin(private, packer, c) for c in cells]
    # Execute
    folded = decrypt_bin_sums(private, sent, packer.cell_bits)
    # Assert: what the sender's fold would have decrypted to, and the sums themselves
    by_sender = packing.unpack(private.decrypt_batch(packing.pack(sent, public.nsquare)),
                               len(sent))
    assert folded == by_sender
    assert [packer.unpack_sum(m) for m in folded] == cells


def test_the_key_holders_fold_refuses_what_is_no_ciphertext(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    public, private = keypair_1024
    good = private.encrypt_batch([1, 2])
    for bad in (mpz(0), public.nsquare):
        with pytest.raises(CryptoError):
            decrypt_bin_sums(private, [good[0], bad, good[1]], 100)
    with pytest.raises(OverflowRiskError):  # a sum wider than p: its residue would not be it
        decrypt_bin_sums(private, good, 512)
    with pytest.raises(OverflowRiskError):  # runs that would pass p
        private.decrypt_folded(good, 100, 6)
    assert decrypt_bin_sums(private, good, 100) == [1, 2]


def test_homomorphic_bin_sums_of_extreme_rows(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    # Prepare: rows at the packer's bounds, summed per bin the way the passive party does
    public, private = keypair_1024
    packer = GradientPacker(value_bits=BITS, max_rows=12)
    top = 1 << BITS
    bins = [[(top, top)] * 12, [], [(-top, 0)] * 5, [(-top, top), (top, 0), (7, 3)], [(0, 0)]]
    sums = []
    for rows in bins:
        acc = mpz(1)
        for c in private.encrypt_batch(packer.pack([g for g, _ in rows], [h for _, h in rows])):
            acc = public.add(acc, c)
        sums.append(acc)
    packing = BinSumPacking.for_key(packer.cell_bits, 1024)
    # Execute
    filled, packed = pack_bin_sums(ciphertexts_to_bytes(sums, public), public, packing)
    plain = packing.unpack(private.decrypt_batch(ciphertexts_from_bytes(packed, public)), 4)
    # Assert
    assert filled == [True, False, True, True, True]
    assert len(packed) == packing.n_ciphertexts(4) * public.ciphertext_bytes
    expected = [(sum(g for g, _ in r), sum(h for _, h in r), len(r)) for r in bins if r]
    assert [packer.unpack_sum(m) for m in plain] == expected


def test_pool_packing_equals_one_process(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    # Prepare: more sums than one block, so several pool tasks
    public, private = keypair_1024
    packer = GradientPacker(value_bits=BITS, max_rows=30_000)
    packing = BinSumPacking.for_key(packer.cell_bits, 1024)
    cells = [(i - 30, i, 1 + i % 3) for i in range(61)]
    blob = ciphertexts_to_bytes([_encrypt_bin(private, packer, c) for c in cells], public)
    # Execute
    with mp.get_context("spawn").Pool(2) as pool:
        pooled = pack_bin_sums(blob, public, packing, pool.map)
    # Assert
    assert pooled == pack_bin_sums(blob, public, packing)


def test_one_sum_per_ciphertext_is_the_identity(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    public, private = keypair_1024
    cts = private.encrypt_batch([5, 6, 7])
    assert BinSumPacking(cell_bits=100, per_ciphertext=1).pack(cts, public.nsquare) == cts


def test_bad_layouts_and_plaintexts_are_rejected(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    public, _ = keypair_1024
    packing = BinSumPacking(cell_bits=10, per_ciphertext=3)
    with pytest.raises(OverflowRiskError):
        BinSumPacking.for_key(cell_bits=600, n_bits=512)
    with pytest.raises(OverflowRiskError):
        BinSumPacking(cell_bits=400, per_ciphertext=3).check_fits(1024)
    with pytest.raises(CryptoError):
        packing.unpack([1, 2], sums=7)  # 7 sums need 3 ciphertexts
    with pytest.raises(OverflowRiskError):
        packing.unpack([1 << 20], sums=2)  # two 10-bit sums cannot reach bit 20
    assert packing.unpack([(1 << 20) | (2 << 10) | 3, 4], sums=4) == [1, 2, 3, 4]
    with pytest.raises(CryptoError):
        pack_bin_sums(b"\x02" * (public.ciphertext_bytes + 1), public, packing)
    with pytest.raises(CryptoError):  # zero is no ciphertext
        pack_bin_sums(bytes(public.ciphertext_bytes), public, packing)


def test_random_high_bits_hide_all_but_the_sums(
        keypair_1024: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    # Prepare: 7 sums of 100-bit cells, 10 per 1024-bit plaintext: one short run; chosen
    # plaintexts far wider than a cell, as a key holder that encrypted 2**i for row i would
    public, private = keypair_1024
    packing = BinSumPacking(cell_bits=100, per_ciphertext=10)
    honest = private.encrypt_batch([k + 1 for k in range(7)])
    chosen = private.encrypt_batch([(1 << 300) + k for k in range(7)])  # top sum: bit 900
    # Execute
    masked = [packing.pack(honest, public.nsquare, public.n) for _ in range(2)]
    seen = [[int(m) for m in private.decrypt_batch(packing.pack(chosen, public.nsquare, public.n))]
            for _ in range(2)]
    # Assert: the sums read as before; above them, fresh random bits each time
    for packed in masked:
        assert packing.unpack(private.decrypt_batch(packed), 7, masked=True) == list(range(1, 8))
    with pytest.raises(OverflowRiskError):
        packing.unpack(private.decrypt_batch(masked[0]), 7)
    assert seen[0][0] % (1 << 700) == seen[1][0] % (1 << 700)
    assert seen[0][0] >> 700 != seen[1][0] >> 700  # bit 900 of the top sum is lost
    unmasked = int(private.decrypt_batch(packing.pack(chosen, public.nsquare))[0])
    assert unmasked >> 900 & 1  # folded without them, it shows
