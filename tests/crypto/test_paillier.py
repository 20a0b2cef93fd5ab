"""Paillier: homomorphisms, phe interoperability, wire bytes, and rejection of bad input."""

from __future__ import annotations

import phe
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import CryptoError, KeyMismatchError
from crypto.paillier import (PaillierPrivateKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                             public_key_from_n)

plain = st.integers(0, 2**200)


@settings(max_examples=30, deadline=None)
@given(a=plain, b=plain, k=st.integers(0, 2**60))
def test_homomorphic_add_and_scalar(keypair_1024, a: int, b: int, k: int) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    ca, cb = pub.raw_encrypt(a), priv.encrypt_batch([b])[0]
    assert priv.raw_decrypt(pub.add(ca, cb)) == a + b
    assert priv.raw_decrypt(pub.scalar_mul(ca, k)) == (a * k) % pub.n


def test_encryption_is_randomised(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    assert pub.raw_encrypt(7) != pub.raw_encrypt(7)
    assert len(set(priv.encrypt_batch([7] * 20))) == 20


def test_interoperates_with_phe_both_ways(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    phe_pub = phe.PaillierPublicKey(int(pub.n))
    phe_priv = phe.PaillierPrivateKey(phe_pub, int(priv.p), int(priv.q))
    assert priv.raw_decrypt(phe_pub.raw_encrypt(123456789)) == 123456789
    assert phe_priv.raw_decrypt(int(priv.encrypt_batch([987654321])[0])) == 987654321
    assert phe_priv.raw_decrypt(int(pub.raw_encrypt(42))) == 42
    encrypted = phe_pub.encrypt(31337)  # phe's own encoding of an int has exponent 0
    assert priv.raw_decrypt(encrypted.ciphertext()) == 31337


def test_wire_bytes_round_trip_and_reject_out_of_range(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, _ = keypair_1024
    cts = [pub.raw_encrypt(m) for m in range(5)]
    blob = ciphertexts_to_bytes(cts, pub)
    assert len(blob) == 5 * pub.ciphertext_bytes == 5 * 256
    assert ciphertexts_from_bytes(blob, pub) == cts
    with pytest.raises(CryptoError, match="multiple"):
        ciphertexts_from_bytes(blob[:-1], pub)
    too_big = int(pub.nsquare).to_bytes(pub.ciphertext_bytes, "big")
    with pytest.raises(CryptoError, match="outside"):
        ciphertexts_from_bytes(too_big, pub)


def test_bad_keys_and_plaintexts_are_rejected(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, priv = keypair_1024
    with pytest.raises(KeyMismatchError):
        PaillierPrivateKey(pub, priv.p, priv.q + 2)
    with pytest.raises(CryptoError):
        pub.raw_encrypt(int(pub.n))
    with pytest.raises(CryptoError, match="bits"):
        public_key_from_n(int(pub.n), expected_bits=2048)
    assert "p=" not in repr(priv) and str(int(priv.p)) not in repr(priv)


def test_full_obfuscator_makes_ordinary_ciphertexts_without_the_short_exponent_table(
        keypair_1024) -> None:  # type: ignore[no-untyped-def]
    pub, short = keypair_1024
    full = PaillierPrivateKey(pub, short.p, short.q, "full")
    cts = full.encrypt_batch([0, 7, 7, int(pub.n) - 1])
    assert full._tables is None  # a uniform r^n each time, no fixed base
    assert len(set(cts)) == 4
    phe_priv = phe.PaillierPrivateKey(phe.PaillierPublicKey(int(pub.n)), int(short.p), int(short.q))
    assert [phe_priv.raw_decrypt(int(c)) for c in cts] == [0, 7, 7, int(pub.n) - 1]
    assert [int(m) for m in short.decrypt_batch(cts)] == [0, 7, 7, int(pub.n) - 1]
    with pytest.raises(CryptoError, match="obfuscator"):
        PaillierPrivateKey(pub, short.p, short.q, "none")
