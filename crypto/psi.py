"""Private set intersection by commutative Diffie-Hellman blinding (DH-PSI).

Ids are hashed into the prime-order subgroup of edwards25519 (libsodium's Elligator 2
``from_uniform``, cofactor cleared) and mapped to their Montgomery u-coordinate; each party
raises points to its secret scalar with X25519. Because X25519 is scalar multiplication,
``X(a, X(b, P)) == X(b, X(a, P))``: equal ids give equal doubly blinded values, and nothing else
about the other party's ids can be learned without solving CDH. Each side learns the size of
the other's set and which of its own ids are in the intersection.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from nacl.bindings import crypto_core_ed25519_from_uniform, crypto_sign_ed25519_pk_to_curve25519

from crypto import CryptoError

POINT_BYTES = 32
_DOMAIN = b"fedboost-psi-v1:"


def hash_to_group(ids: Sequence[str]) -> list[bytes]:
    """Map ids to points (32-byte u-coordinates) of the prime-order subgroup."""
    out = []
    for ident in ids:
        digest = hashlib.sha256(_DOMAIN + ident.encode("utf-8")).digest()
        out.append(crypto_sign_ed25519_pk_to_curve25519(crypto_core_ed25519_from_uniform(digest)))
    return out


class PsiKey:
    """A party's secret blinding scalar for one PSI run."""

    def __init__(self) -> None:
        self._secret = X25519PrivateKey.generate()

    def blind(self, points: Sequence[bytes]) -> list[bytes]:
        """Raise each point to the secret scalar."""
        out = []
        for point in points:
            if len(point) != POINT_BYTES:
                raise CryptoError(f"PSI point of {len(point)} bytes, expected {POINT_BYTES}")
            try:
                out.append(self._secret.exchange(X25519PublicKey.from_public_bytes(point)))
            except ValueError as exc:  # low-order point: a malicious or corrupt input
                raise CryptoError("PSI point of low order rejected") from exc
        return out


def split_points(blob: bytes) -> list[bytes]:
    """Cut concatenated points apart, checking the length."""
    if len(blob) % POINT_BYTES:
        raise CryptoError(f"PSI batch of {len(blob)} bytes is not a multiple of {POINT_BYTES}")
    return [blob[i:i + POINT_BYTES] for i in range(0, len(blob), POINT_BYTES)]
