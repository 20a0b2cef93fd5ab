"""End-to-end encrypted bodies: only the recipient can read an envelope, not the broker.

For federations that do not trust the broker's operator (TLS protects each hop, but the broker
itself sees every body). Each pair of identities shares one static key: X25519 between the
sender's and the recipient's signing keys (Ed25519 keys mapped to Curve25519 by libsodium), put
through HKDF-SHA256 with both names, so nothing beyond the federation's existing ``.key`` /
``.pub`` files is needed. A body is sealed with ChaCha20-Poly1305 under a random 96-bit nonce;
the additional data binds it to the seal's header (signer, recipient, nonce, time), so a
ciphertext cannot be moved to another message. The seal's Ed25519 signature covers the
ciphertext (encrypt, then sign): forged or tampered bodies are refused before decryption.

Random nonces under one static key stay safe for far more messages than a federation sends
(the collision bound of 96-bit nonces is about 2^32 messages per pair for a 2^-32 risk).
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nacl.bindings import (crypto_sign_ed25519_pk_to_curve25519,
                           crypto_sign_ed25519_sk_to_curve25519, crypto_sign_seed_keypair)

from messages import DecodeError

NONCE_BYTES = 12
TAG_BYTES = 16
_INFO = b"fedboost e2e body key v1"


def pair_key(own_private: bytes, own_name: str, peer_public: bytes, peer_name: str) -> bytes:
    """The 32-byte body key that ``own_name`` and ``peer_name`` share (the same from both
    ends): X25519 of their Ed25519 keys' Curve25519 forms, through HKDF with both names."""
    _, secret64 = crypto_sign_seed_keypair(own_private)
    own = X25519PrivateKey.from_private_bytes(crypto_sign_ed25519_sk_to_curve25519(secret64))
    peer = X25519PublicKey.from_public_bytes(crypto_sign_ed25519_pk_to_curve25519(peer_public))
    shared = own.exchange(peer)
    first, second = sorted([own_name, peer_name])
    salt = len(first).to_bytes(1, "big") + first.encode() + second.encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=_INFO).derive(shared)


def own_key(own_private: bytes, own_name: str, purpose: bytes) -> bytes:
    """A 32-byte key that only holders of ``own_name``'s signing key can derive: the pair key
    of the identity with itself, through HKDF once more for ``purpose``. A party's processes
    (on any of its machines) seal to one another with it; the broker and other parties cannot."""
    public = crypto_sign_seed_keypair(own_private)[0]
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_INFO, info=purpose).derive(
        pair_key(own_private, own_name, public, own_name))


def encrypt_body(key: bytes, body: bytes, associated: bytes) -> bytes:
    """``nonce || ChaCha20-Poly1305(body)``, bound to ``associated`` (the seal's header)."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, body, associated)


def decrypt_body(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    """The body of ``encrypt_body``, or ``DecodeError`` if it was not made under ``key`` for
    exactly ``associated``."""
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise DecodeError("encrypted body too short")
    try:
        return ChaCha20Poly1305(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:],
                                             associated)
    except InvalidTag:
        raise DecodeError("encrypted body does not decrypt for this recipient") from None
