"""Okamoto-Uchiyama: homomorphisms, obfuscators made ahead, packing at the capacity p allows,
wire bytes, the scheme seam, and rejection of bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import CryptoError, KeyMismatchError, OverflowRiskError
from crypto.compress import BinSumPacking, decrypt_bin_sums
from crypto.encoding import GradientPacker
from crypto.ou import OUPrivateKey, OUPublicKey, generate_keypair, public_key_from_n
from crypto.schemes import (ciphertexts_from_bytes, ciphertexts_to_bytes,
                            private_key_from_factors)
from crypto.schemes import public_key_from_n as scheme_public_key

plain = st.integers(0, 2**150)


@settings(max_examples=30, deadline=None)
@given(a=plain, b=plain, k=st.integers(0, 2**60))
def test_homomorphic_add_and_scalar(ou_keypair_1024, a: int, b: int, k: int) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    ca, cb = pub.raw_encrypt(a), priv.encrypt_batch([b])[0]
    assert priv.raw_decrypt(ca) == a and priv.raw_decrypt(cb) == b
    assert priv.raw_decrypt(pub.add(ca, cb)) == a + b
    assert priv.raw_decrypt(pub.scalar_mul(ca, k)) == (a * k) % priv.p
    assert priv.raw_decrypt(pub.add_plain(ca, b)) == a + b


def test_plaintext_space_is_below_p_and_smaller_than_paillier(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    assert pub.n.bit_length() == 1024 and pub.ciphertext_bytes == 128
    assert pub.plaintext_bits == priv.p.bit_length() == 341
    assert pub.max_plaintext < priv.p
    assert priv.raw_decrypt(pub.raw_encrypt(pub.max_plaintext)) == pub.max_plaintext
    with pytest.raises(CryptoError):
        pub.raw_encrypt(pub.max_plaintext + 1)
    with pytest.raises(CryptoError):
        priv.encrypt_batch([-1])


def test_obfuscators_made_ahead_are_used_once_and_randomise(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    spare = priv.obfuscators(5)
    cts = priv.encrypt_batch([7] * 8, spare)
    assert spare == []  # all five taken out, three more made fresh
    assert len(set(cts)) == 8
    assert priv.decrypt_batch(cts) == [7] * 8
    full = OUPrivateKey(pub, priv.p, priv.q, "full")
    assert full.decrypt_batch(full.encrypt_batch([0, 9, 9])) == [0, 9, 9]
    assert full._tables is None


@settings(max_examples=20, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-2**40, 2**40), st.integers(0, 2**40)),
                     min_size=1, max_size=40))
def test_packed_gradients_with_negative_g_sum_exactly(ou_keypair_1024,  # type: ignore[no-untyped-def]
                                                       rows: list[tuple[int, int]]) -> None:
    pub, priv = ou_keypair_1024
    packer = GradientPacker(value_bits=40, max_rows=30_000)
    packer.check_fits(pub.plaintext_bits)
    cts = priv.encrypt_batch(packer.pack([g for g, _ in rows], [h for _, h in rows]))
    total = cts[0]
    for c in cts[1:]:
        total = pub.add(total, c)
    assert packer.unpack_sum(priv.raw_decrypt(total)) == (sum(g for g, _ in rows),
                                                           sum(h for _, h in rows), len(rows))


def test_packing_round_trip_at_the_capacity_limit(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    packer = GradientPacker(value_bits=30, max_rows=1000)
    packing = BinSumPacking.for_key(packer.cell_bits, pub.plaintext_bits)
    assert packing.per_ciphertext == (pub.plaintext_bits - 1) // packer.cell_bits
    with pytest.raises(OverflowRiskError):
        BinSumPacking(packer.cell_bits, packing.per_ciphertext + 1).check_fits(pub.plaintext_bits)
    top = (1 << packer.cell_bits) - 1  # every sum at its widest
    sums = [top, 0, 12345, top] * packing.per_ciphertext
    packed = packing.pack(priv.encrypt_batch(sums), pub.cipher_modulus)
    plain = priv.decrypt_batch(packed)
    assert packing.unpack(plain, len(sums)) == sums
    masked = packing.pack(priv.encrypt_batch(sums), pub.cipher_modulus, n=pub)
    assert packing.unpack(priv.decrypt_batch(masked), len(sums), masked=True) == sums
    # the key holder's own fold, modulo p^2 only
    assert decrypt_bin_sums(priv, priv.encrypt_batch(sums), packer.cell_bits) == sums
    with pytest.raises(OverflowRiskError):
        priv.decrypt_folded(priv.encrypt_batch([1]), packer.cell_bits,
                            priv.fold_run(packer.cell_bits) + 1)


def test_wire_bytes_round_trip_and_reject_out_of_range(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, _ = ou_keypair_1024
    cts = [pub.raw_encrypt(m) for m in range(5)]
    blob = ciphertexts_to_bytes(cts, pub)
    assert len(blob) == 5 * 128
    assert ciphertexts_from_bytes(blob, pub) == cts
    with pytest.raises(CryptoError, match="multiple"):
        ciphertexts_from_bytes(blob[:-1], pub)
    with pytest.raises(CryptoError, match="outside"):
        ciphertexts_from_bytes(int(pub.n).to_bytes(128, "big"), pub)


def test_public_key_travels_as_n_and_the_seam_rebuilds_keys(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    received = scheme_public_key("ou", int.from_bytes(pub.n_bytes, "big"), expected_bits=1024)
    assert received == pub and received.g == pub.g and received.h == pub.h
    again = private_key_from_factors("ou", int(pub.n), int(priv.p), int(priv.q))
    assert again.raw_decrypt(received.raw_encrypt(31337)) == 31337
    with pytest.raises(CryptoError, match="scheme"):
        scheme_public_key("rsa", int(pub.n))
    with pytest.raises(CryptoError, match="bits"):
        public_key_from_n(int(pub.n), expected_bits=2048)


def test_bad_keys_are_rejected_and_factors_never_printed(ou_keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = ou_keypair_1024
    with pytest.raises(KeyMismatchError):
        OUPrivateKey(pub, priv.p, priv.q + 2)
    with pytest.raises(KeyMismatchError):  # a Paillier-shaped n = p q is not p^2 q
        OUPrivateKey(OUPublicKey(priv.p * priv.q), priv.p, priv.q)
    with pytest.raises(CryptoError, match="at least"):
        generate_keypair(512)
    assert str(int(priv.p)) not in repr(priv) and str(int(priv.q)) not in repr(priv)


@pytest.mark.parametrize("bits", [2048])
def test_2048_bit_key_has_the_sizes_the_docs_state(bits: int) -> None:
    pub, priv = generate_keypair(bits)
    assert pub.n.bit_length() == 2048 and pub.ciphertext_bytes == 256
    assert priv.p.bit_length() == 682 and priv.q.bit_length() == 684
    assert priv.raw_decrypt(pub.raw_encrypt(2**600)) == 2**600
