"""Draws only their drawer can make: pseudorandom streams under a party's own secret.

A random choice whose outcome another party observes or can count (a member's row subsample,
its dealing of rows to trees, noise, hash functions) must not come from a seed in a job spec or
a message: whoever holds the seed replays the draw. These streams come from a key derived with
HMAC-SHA256 from a secret of the drawing party (its checkpoint key, ``workers.checkpoint``,
which never leaves its private folder) and the draw's purpose and coordinates; the keystream is
ChaCha20's. The same secret and coordinates give the same draws, which is what lets a resumed
job reproduce the uninterrupted one without storing them.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from boosting._typing import FloatArray
from boosting.privacy import PrivacyPlan, deal_rows

_NONCE = bytes(16)
"""Every ChaCha20 key here is an HMAC output used for one stream, so a fixed nonce never
repeats under a key."""


def derive_key(secret: bytes, purpose: str, *parts: str | bytes) -> bytes:
    """A 32-byte key for one use: HMAC-SHA256 under ``secret`` of the length-prefixed parts."""
    message = bytearray()
    for part in (purpose, *parts):
        raw = part.encode() if isinstance(part, str) else part
        message += struct.pack(">I", len(raw)) + raw
    return hmac.new(secret, bytes(message), hashlib.sha256).digest()


def uniform(key: bytes, count: int) -> FloatArray:
    """``count`` uniforms in (0, 1) from the ChaCha20 keystream under ``key`` (53 bits each)."""
    stream = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor()
    words = np.frombuffer(stream.update(bytes(8 * count)), "<u8") >> np.uint64(11)
    values: FloatArray = (words.astype(np.float64) + 0.5) * 2.0 ** -53
    return values


def standard_normal(key: bytes, count: int) -> FloatArray:
    """``count`` N(0, 1) draws from the keystream under ``key`` (Box-Muller)."""
    u = uniform(key, 2 * ((count + 1) // 2))
    radius = np.sqrt(-2.0 * np.log(u[0::2]))
    angle = 2.0 * np.pi * u[1::2]
    values: FloatArray = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return values.ravel()[:count]  # pairs in order: a longer draw starts with a shorter one


def keyed_generator(key: bytes) -> np.random.Generator:
    """A numpy generator seeded with all 256 bits of ``key`` (for the code that takes one,
    such as ``boosting.privacy.deal_rows``): its draws are as secret as the key."""
    return np.random.default_rng(np.frombuffer(key, dtype="<u4").tolist())


# ---- a party's draws of its own rows (horizontal members, vertical active party) ----

def in_tree_rows(secret: bytes, tree: int, n_rows: int, subsample: float) -> npt.NDArray[np.bool_]:
    """Tree ``tree``'s row subsample: each row in with probability ``subsample``."""
    if subsample >= 1.0:
        return np.ones(n_rows, dtype=bool)
    rows: npt.NDArray[np.bool_] = uniform(derive_key(secret, "subsample", str(tree)),
                                          n_rows) < subsample
    return rows


def dealt_rows(secret: bytes, plan: PrivacyPlan, ensemble: int,
               n_rows: int) -> npt.NDArray[np.int64]:
    """Each row's tree (position) in ``ensemble`` (``boosting.privacy.deal_rows``)."""
    return deal_rows(plan, ensemble, n_rows,
                     keyed_generator(derive_key(secret, "dealing", str(ensemble))))
