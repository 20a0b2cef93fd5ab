"""The active party's choice of each node's split in the vertical random forest.

Per node, every drawn feature (own ones in plaintext, a passive party's from its decrypted
histograms) offers its best threshold by the impurity drop (seed 002, Eq. 2) and the thresholds
``min_samples_leaf`` allows. The node takes the best drop; a node where no threshold lowers the
impurity (a pure node, or one whose labels no drawn feature separates) takes one of the allowed
thresholds at random instead of becoming a leaf. So whether a node is split, and so which
nodes passive parties are asked about, depends only on what they can check themselves (depth,
rows, the drawn features' bins), never on the labels: a pure node looks like any other. A
pure node's children are as pure as it is, so the forest predicts as if it were a leaf; an
impure node without a drop (once a leaf) now splits, and its children may split further.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boosting._typing import FloatArray
from boosting.forest import ForestSplit, allowed_splits, best_bin_split
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PrivateKey, ciphertexts_from_bytes
from messages.forest import LevelHistograms
from workers import ProtocolError

@dataclass(frozen=True, slots=True)
class FeatureOption:
    """What one drawn feature offers a node: its owner, weighted count per bin and best split
    (None if no threshold lowers the impurity)."""

    owner: str
    feature: int
    count: FloatArray
    best: ForestSplit | None


def own_options(owner: str, objective: str, codes: np.ndarray, weights: FloatArray,
                channels: FloatArray, feature: int, n_bins: int,
                min_samples_leaf: int) -> FeatureOption:
    """One of the active party's own features, from its bin codes over the node's rows."""
    # weighted counts: floats (numpy's stub types every bincount as integers)
    count = np.bincount(codes, weights=weights, minlength=n_bins).astype(np.float64, copy=False)
    sums = np.stack([np.bincount(codes, weights=weights * channels[:, c], minlength=n_bins)
                     for c in range(channels.shape[1])], axis=1).astype(np.float64, copy=False)
    return FeatureOption(owner, feature, count,
                         best_bin_split(objective, count, sums, feature, min_samples_leaf))


@dataclass(frozen=True, slots=True)
class Decryption:
    """How the active party reads a passive party's histograms."""

    private: PrivateKey
    packer: GradientPacker
    packing: BinSumPacking
    scale: float
    n_channels: int
    objective: str
    n_bins: int
    min_samples_leaf: int


def passive_options(how: Decryption, passive: str, asked: dict[int, list[int]],
                    msg: LevelHistograms) -> list[tuple[int, FeatureOption]]:
    """Decrypt one passive party's histograms of a level into an option per (node, feature)
    asked, in request order."""
    public = how.private.public_key
    cells = sum(len(f) for f in asked.values()) * how.n_bins
    groups = -(-how.n_channels // 2)
    if len(msg.ciphertexts) != (groups if asked else 0):
        raise ProtocolError(f"{passive} sent {len(msg.ciphertexts)} label groups, not {groups}")
    if len(msg.filled) != (cells + 7) // 8:
        raise ProtocolError(f"{passive}: histogram mask of the wrong size")
    filled = np.unpackbits(np.frombuffer(msg.filled, dtype=np.uint8), count=cells).astype(bool) \
        if cells else np.zeros(0, dtype=bool)
    n_filled = int(filled.sum())
    count = np.zeros(cells)
    sums = np.zeros((cells, how.n_channels))
    for g, blob in enumerate(msg.ciphertexts):
        if len(blob) != how.packing.n_ciphertexts(n_filled) * public.ciphertext_bytes:
            raise ProtocolError(f"{passive}: {len(blob)} bytes of histograms for {n_filled} "
                                f"filled bins")
        plain = how.private.decrypt_batch(ciphertexts_from_bytes(blob, public))
        unpacked = [how.packer.unpack_sum(v)
                    for v in how.packing.unpack(plain, n_filled, masked=True)]
        values = np.array(unpacked, dtype=np.float64).reshape(-1, 3)
        count[filled] = values[:, 2]
        sums[filled, 2 * g] = values[:, 0] / how.scale
        if 2 * g + 1 < how.n_channels:
            sums[filled, 2 * g + 1] = values[:, 1] / how.scale
    out = []
    cell = 0
    for node, features in asked.items():
        for f in features:
            part = slice(cell, cell + how.n_bins)
            best = best_bin_split(how.objective, count[part], sums[part], f,
                                  how.min_samples_leaf)
            out.append((node, FeatureOption(passive, f, count[part], best)))
            cell += how.n_bins
    return out


def choose_split(options: list[FeatureOption], rng: np.random.Generator,
                 min_samples_leaf: int) -> tuple[str, ForestSplit] | None:
    """The node's split: the best drop over its features, else (no drop) one of the allowed
    thresholds drawn uniformly; None only if no drawn feature has an allowed threshold."""
    scored = [(o.owner, o.best) for o in options if o.best is not None]
    if scored:
        return max(scored, key=lambda c: c[1].drop)
    allowed = [(o.owner, split) for o in options
               for split in allowed_splits(o.count, o.feature, min_samples_leaf)]
    if not allowed:
        return None
    return allowed[int(rng.integers(len(allowed)))]
