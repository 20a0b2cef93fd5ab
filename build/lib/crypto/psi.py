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

A million ids take about 40 s of one core to hash and blind (X25519 ~34 us a point), so
``PsiKey.hash_and_blind`` and ``PsiKey.blind_batched`` cut them into batches for one process
per core; each pool process rebuilds the key from its scalar (``PsiKey(secret)``), handed over
a local pipe by the party's own process. The bytes are the same as blinding in one go.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from crypto._gmp import invert, jacobi, mpz

from crypto import CryptoError

POINT_BYTES = 32
_DOMAIN = b"fedboost-psi-v2:"

BATCH = 16_384
"""Points per batch of a pooled blind: ~1 s of one core (X25519 ~60 us a point), so progress
comes often and a batch's 512 KB crosses to a process cheaply."""

Progress = Callable[[int, int], None]
"""Called after each batch with points done and points in all."""


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
    """A party's secret blinding scalar for one PSI run (``secret``: 32 bytes of an existing
    key, as a pool process gets it; None: a new random one)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = (X25519PrivateKey.generate() if secret is None
                        else X25519PrivateKey.from_private_bytes(secret))

    @property
    def secret_bytes(self) -> bytes:
        """The raw scalar, for this party's own pool processes only (never the wire)."""
        return self._secret.private_bytes(serialization.Encoding.Raw,
                                          serialization.PrivateFormat.Raw,
                                          serialization.NoEncryption())

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

    def blind_blob(self, blob: bytes) -> bytes:
        """:meth:`blind` on concatenated points, concatenated."""
        return b"".join(self.blind(split_points(blob)))

    def blind_batched(self, points: bytes, *, processes: int | None = None, batch: int = BATCH,
                      progress: Progress | None = None,
                      on_start: Callable[[], None] | None = None) -> bytes:
        """:meth:`blind_blob` in batches of ``batch`` points on ``processes`` processes (one
        per core by default); the same bytes as blinding in one go."""
        _check_blob(points)
        n = len(points) // POINT_BYTES
        step = batch * POINT_BYTES
        return self._pooled("blind", (points[a:a + step] for a in range(0, len(points), step)),
                            n, batch, processes, progress, on_start)

    def hash_and_blind(self, ids: Sequence[str], *, processes: int | None = None,
                       batch: int = BATCH, progress: Progress | None = None,
                       on_start: Callable[[], None] | None = None) -> bytes:
        """``blind(hash_to_group(ids))`` concatenated, hashing and blinding in the same
        batches on ``processes`` processes."""
        return self._pooled("hash", (list(ids[a:a + batch]) for a in range(0, len(ids), batch)),
                            len(ids), batch, processes, progress, on_start)

    def _pooled(self, op: str, batches: Iterator[bytes | list[str]], n: int, batch: int,
                processes: int | None, progress: Progress | None,
                on_start: Callable[[], None] | None) -> bytes:
        processes = processes or max(1, os.cpu_count() or 1)
        if n <= batch or processes == 1:  # starting processes would cost more than it saves
            return _collect((_apply(self, op, b) for b in batches), n, batch, progress)
        with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn"),
                                 initializer=_init,
                                 initargs=(self.secret_bytes, on_start)) as pool:
            return _collect(pool.map(partial(_pool_apply, op), batches), n, batch, progress)


def _apply(key: PsiKey, op: str, batch: bytes | list[str]) -> bytes:
    if op == "blind" and isinstance(batch, bytes):
        return key.blind_blob(batch)
    if op == "hash" and isinstance(batch, list):
        return b"".join(key.blind(hash_to_group(batch)))
    raise TypeError(f"PSI batch operation {op!r} on {type(batch).__name__}")


_KEY: PsiKey | None = None
"""A pool process's copy of its party's PSI key (set by the pool initializer)."""


def _init(secret: bytes, on_start: Callable[[], None] | None) -> None:
    global _KEY
    if on_start is not None:
        on_start()
    _KEY = PsiKey(secret)


def _pool_apply(op: str, batch: bytes | list[str]) -> bytes:
    if _KEY is None:
        raise CryptoError("PSI pool process without its key")
    return _apply(_KEY, op, batch)


def _collect(parts: Iterator[bytes], n: int, batch: int, progress: Progress | None) -> bytes:
    out = []
    for k, part in enumerate(parts):
        out.append(part)
        if progress is not None:
            progress(min(n, (k + 1) * batch), n)
    return b"".join(out)


def _check_blob(blob: bytes) -> None:
    if len(blob) % POINT_BYTES:
        raise CryptoError(f"PSI batch of {len(blob)} bytes is not a multiple of {POINT_BYTES}")


def split_points(blob: bytes) -> list[bytes]:
    """Cut concatenated points apart, checking the length."""
    _check_blob(blob)
    return [blob[i:i + POINT_BYTES] for i in range(0, len(blob), POINT_BYTES)]
