"""Pairwise masks for secure aggregation of histograms (Bonawitz et al., CCS 2017, the
"masking with one-time pads" part; no secret-shared recovery of dropped members).

Each pair of members ``u < v`` agrees on a secret by X25519 between their per-job ephemeral
keys, and derives from it, per round, a ChaCha20 keystream ``p_uv`` of 64-bit words. Member ``u``
sends ``y_u = x_u + sum_{v > u} p_uv - sum_{v < u} p_vu (mod 2^64)``: every ``p_uv`` is added
once and subtracted once, so the aggregator's sum of the ``y_u`` is the sum of the ``x_u`` mod
2^64, which is the exact int64 sum as long as the true sum fits in int64 (the histogram sums are
kept below 2^62 by ``boosting.fixedpoint``).

What each party learns: the aggregator, holding all ``y_u``, learns only the sum over the
round's members (each ``y_u`` alone is uniform given the others' secrets are unknown to it).
A member learns nothing from its own secrets about others' values. A pair's masks are known to
both members of the pair, so two colluding members ``v, w`` together with the aggregator learn
``x_u`` for a three-member round; with more honest members the aggregator learns the sum of the
honest ones. Protection is against honest-but-curious parties; the public keys must reach the
members authenticated (signed envelopes), or the aggregator could stand in the middle.

Rules the caller keeps:

* A round (:class:`MaskRound`) masks ONE vector per member. Masking a second, different vector
  under the same round lets the aggregator subtract the two and read ``x - x'``; a retry with
  new values must raise ``attempt``.
* ``secrets`` holds exactly the round's other live members. If a member drops out after the
  others masked with it, its masks do not cancel and the round must be redone (``attempt + 1``)
  without it; this module has no recovery of a dropped member's masks.

Sealing (Bonawitz et al.'s reason for a second mask, without their secret sharing). A round
whose vectors are all in opens, whenever they came: a member that sent its vector late, after
the others had given the round up and redone it without it, would hand the aggregator two sums
over the same rows whose difference is that member's vector. So a round that may be given up is
also sealed: each member adds ``PRF(k_r, name)`` (:func:`seal_vector`), where the round key
``k_r`` (:func:`round_seal_key`) derives from every round member's seal contribution, a random
32 bytes each member sends each other one encrypted under their pair secret
(:func:`seal_share`), never to the aggregator. A member sends ``k_r`` to the aggregator only
once the round is complete (every vector in), and never for a round given up: the vectors of a
round given up stay sealed whoever sends what later. Any member of the round can release
``k_r``, so one member's silence cannot hold a complete round shut. Every member knows every
contribution: a member colluding with the aggregator opens rounds given up.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from workers import ProtocolError

U64Array = npt.NDArray[np.uint64]
I64Array = npt.NDArray[np.int64]

PUBLIC_KEY_BYTES = 32
_PAIR_INFO = b"fedboost secagg pair secret v1"
_ROUND_INFO = b"fedboost secagg round mask v1"
_SHARE_INFO = b"fedboost secagg seal share v1"
_SEAL_INFO = b"fedboost secagg round seal v1"
SEAL_BYTES = 32
NONCE_BYTES = 12
# The ChaCha20 key is fresh for every (pair, round), so one fixed nonce never repeats under a key.
_NONCE = bytes(16)


class MaskError(ProtocolError, ValueError):
    """A mask cannot be made or removed: a bad peer key, unknown pair, mismatched vectors."""


def _fields(*parts: str | int) -> bytes:
    """Unambiguous encoding of strings and integers (each length-prefixed)."""
    out = bytearray()
    for part in parts:
        raw = part.encode() if isinstance(part, str) else struct.pack(">q", part)
        out += struct.pack(">I", len(raw)) + raw
    return bytes(out)


class MaskKey:
    """A member's ephemeral X25519 key for one job session (never written to disk or sent)."""

    __slots__ = ("_private",)

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private

    @classmethod
    def generate(cls) -> MaskKey:
        """A fresh random key."""
        return cls(X25519PrivateKey.generate())

    def public_bytes(self) -> bytes:
        """The 32-byte public key to send to the other members."""
        return self._private.public_key().public_bytes_raw()

    def exchange(self, peer_public: bytes) -> bytes:
        """Raw X25519 shared value with a peer's public key (use :func:`pair_secret`)."""
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise MaskError(f"a mask public key has {PUBLIC_KEY_BYTES} bytes, "
                            f"got {len(peer_public)}")
        try:
            return self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:  # all-zero shared value: a low-order point
            raise MaskError("peer mask public key is a low-order point; refusing it") from None


def pair_secret(key: MaskKey, peer_public: bytes, job: str, me: str, peer: str) -> bytes:
    """The 32-byte secret ``me`` shares with ``peer`` for ``job`` (the same on both sides):
    HKDF-SHA256 over their X25519 value, bound to the job and the sorted pair of names.

    Raises
    ------
    MaskError
        If the peer's key is not 32 bytes or is a low-order point, or ``me == peer``.
    """
    if me == peer:
        raise MaskError(f"member {me!r} cannot share a mask secret with itself")
    shared = key.exchange(peer_public)
    first, second = sorted([me, peer])
    info = _PAIR_INFO + _fields(job, first, second)
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


@dataclass(frozen=True, slots=True)
class MaskRound:
    """Where a mask is used; every field changes the keystream (one vector per round)."""

    job: str
    purpose: str
    tree: int
    depth: int
    attempt: int


def _stream(key: bytes, length: int) -> U64Array:
    """``length`` 64-bit ChaCha20 keystream words under ``key`` (fresh per use)."""
    encryptor = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    words: U64Array = np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8")
    return words.astype(np.uint64)


def _derive(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def pair_stream(secret: bytes, me: str, peer: str, round_: MaskRound, length: int) -> U64Array:
    """The ``length`` 64-bit keystream words a pair shares in one round (ChaCha20 under a key
    derived from the pair secret and the round)."""
    first, second = sorted([me, peer])
    info = _ROUND_INFO + _fields(round_.job, round_.purpose, round_.tree, round_.depth,
                                 round_.attempt, first, second)
    return _stream(_derive(secret, info), length)


def seal_share(secret: bytes, contribution: bytes, job: str, sender: str,
               recipient: str) -> tuple[bytes, bytes]:
    """``(nonce, ciphertext)``: the sender's seal contribution for one other member, under a
    key derived from their pair secret (ChaCha20-Poly1305, bound to the job and the direction).
    """
    if len(contribution) != SEAL_BYTES:
        raise MaskError(f"a seal contribution has {SEAL_BYTES} bytes, got {len(contribution)}")
    key = _derive(secret, _SHARE_INFO + _fields(job, sender, recipient))
    nonce = os.urandom(NONCE_BYTES)
    return nonce, ChaCha20Poly1305(key).encrypt(nonce, contribution, None)


def open_seal_share(secret: bytes, nonce: bytes, sealed: bytes, job: str, sender: str,
                    recipient: str) -> bytes:
    """The sender's contribution from :func:`seal_share`.

    Raises
    ------
    MaskError
        If the nonce has the wrong length or the ciphertext does not authenticate (another
        key, another direction, or altered bytes).
    """
    if len(nonce) != NONCE_BYTES:
        raise MaskError(f"a seal share's nonce has {NONCE_BYTES} bytes, got {len(nonce)}")
    key = _derive(secret, _SHARE_INFO + _fields(job, sender, recipient))
    try:
        contribution = ChaCha20Poly1305(key).decrypt(nonce, sealed, None)
    except InvalidTag:
        raise MaskError(f"{sender}'s seal share does not open under the pair key") from None
    if len(contribution) != SEAL_BYTES:
        raise MaskError(f"{sender}'s seal contribution has {len(contribution)} bytes")
    return contribution


def round_seal_key(contributions: dict[str, bytes], round_: MaskRound) -> bytes:
    """The key of one round's seals: HKDF over the contributions of exactly the round's
    members (``contributions`` maps each of them, in any order, to its 32 bytes) and the
    round."""
    if any(len(c) != SEAL_BYTES for c in contributions.values()):
        raise MaskError(f"seal contributions have {SEAL_BYTES} bytes")
    members = sorted(contributions)
    info = _SEAL_INFO + _fields(round_.job, round_.purpose, round_.tree, round_.depth,
                                round_.attempt, *members)
    return _derive(b"".join(contributions[m] for m in members), info)


def seal_stream(round_key: bytes, member: str, length: int) -> U64Array:
    """The words ``member`` adds to its masked vector of the round of ``round_key``."""
    if len(round_key) != SEAL_BYTES:
        raise MaskError(f"a round key has {SEAL_BYTES} bytes, got {len(round_key)}")
    return _stream(_derive(round_key, _SEAL_INFO + _fields(member)), length)


def seal_vector(masked: U64Array, round_key: bytes, member: str) -> U64Array:
    """``masked + seal_stream(round_key, member) (mod 2^64)``."""
    return masked + seal_stream(round_key, member, masked.size)


def unseal_sum(total: U64Array, round_key: bytes, members: list[str]) -> U64Array:
    """The sum of the members' sealed vectors without their seals."""
    opened = total.copy()
    for member in members:
        opened -= seal_stream(round_key, member, total.size)
    return opened


def mask_vector(values: I64Array, me: str, secrets: dict[str, bytes],
                round: MaskRound) -> U64Array:  # noqa: A002 - the lead's API names it so
    """``values + sum_{peer > me} p - sum_{peer < me} p (mod 2^64)`` as uint64.

    ``secrets`` maps every OTHER live member of the round to its :func:`pair_secret`.

    Raises
    ------
    MaskError
        If ``values`` is not a 1-d int64 vector or ``secrets`` names ``me``.
    """
    if values.ndim != 1 or values.dtype != np.int64:
        raise MaskError(f"masking needs a 1-d int64 vector, got {values.ndim}-d {values.dtype}")
    if me in secrets:
        raise MaskError(f"member {me!r} is among its own mask peers")
    masked = values.view(np.uint64).copy()
    for peer in sorted(secrets):
        stream = pair_stream(secrets[peer], me, peer, round, values.size)
        if peer > me:
            masked += stream
        else:
            masked -= stream
    return masked


def unmask_sum(masked: list[U64Array]) -> I64Array:
    """The sum of the members' masked vectors mod 2^64, read as int64: the plain sum once all
    the round's members are in.

    Raises
    ------
    MaskError
        If there are no vectors, or they differ in length or are not 1-d uint64.
    """
    if not masked:
        raise MaskError("no masked vectors to sum")
    lengths = {m.shape for m in masked}
    if len(lengths) != 1 or any(m.ndim != 1 or m.dtype != np.uint64 for m in masked):
        raise MaskError(f"masked vectors must be 1-d uint64 of one length, got "
                        f"{sorted(str(m.dtype) + str(m.shape) for m in masked)}")
    total = np.zeros(masked[0].size, dtype=np.uint64)
    for vector in masked:
        total += vector
    result: I64Array = total.view(np.int64)
    return result
