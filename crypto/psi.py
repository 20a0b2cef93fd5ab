"""Private set intersection by commutative Diffie-Hellman blinding (DH-PSI).

Ids are hashed onto Curve25519 by Elligator 2 (RFC 9380's map for curve25519, computing the
Montgomery u-coordinate only), and each party raises points to its secret scalar with X25519.
Because X25519 is scalar multiplication, ``X(a, X(b, P)) == X(b, X(a, P))``: equal ids give
equal doubly blinded values, and nothing else about the other party's ids can be learned
without solving CDH. X25519 clamps every scalar to a multiple of the cofactor 8, so blinded
values lie in the prime-order subgroup whatever small-order part a hashed point has; a point
of small order itself is refused. Each side learns the size of the other's set and which of its
own ids are in the intersection.

The map needs no square root for the u-coordinate, only a Legendre symbol (one Jacobi symbol
with GMP): ~10x faster than libsodium's Edwards map plus conversion to Montgomery form, which
hashed a million ids in about 70 s of one core. It is not constant-time: it runs on the party's
own ids, on its own machine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from crypto._gmp import invert, jacobi, mpz

from crypto import CryptoError

POINT_BYTES = 32
_DOMAIN = b"fedboost-psi-v2:"


_P = mpz((1 << 255) - 19)
_A = mpz(486662)  # Curve25519: v^2 = u^3 + A u^2 + u


def hash_to_group(ids: Sequence[str]) -> list[bytes]:
    """Map ids to Curve25519 points (32-byte little-endian u-coordinates) by Elligator 2."""
    # 512 hash bits reduced modulo p: a field element with negligible bias
    return [int(elligator2_u(int.from_bytes(hashlib.sha512(_DOMAIN + i.encode("utf-8")).digest(),
                                            "little"))).to_bytes(POINT_BYTES, "little")
            for i in ids]


def elligator2_u(r: int) -> mpz:
    """RFC 9380's Elligator 2 map for curve25519 (Z = 2), u-coordinate only: ``w = -A / (1 +
    2 r^2)`` if ``w^3 + A w^2 + w`` is a square (then w is on the curve), else ``-w - A``."""
    p, a = _P, _A
    r = mpz(r) % p
    denominator = (1 + 2 * r * r) % p  # never 0: -1/2 is not a square modulo p
    w = -a * invert(denominator, p) % p
    if jacobi((w * w * w + a * w * w + w) % p, p) == -1:
        w = (-w - a) % p
    return w


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
