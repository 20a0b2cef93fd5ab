"""A passive party's histogram work shared among its processes, feature by feature.

When the party runs helper processes, each level's features are units of a claim pool
(``Transport.open_claims``): the coordinating process and every helper that got the level's
data take one feature at a time until none is left, so a process that started late (its data
had to travel to it) or runs slower simply takes fewer. Each feature's bin sums are packed by
the process that summed them; the coordinating process sums any feature a helper claimed but
never returned (a helper that died), so a level never waits on a lost unit.
Products modulo the ciphertext modulus (n^2 for Paillier, n for OU) do not depend on which process summed what, so the decrypted sums, and the
model, are the same however the work was shared.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from crypto._gmp import mpz
from crypto.bin_products import bin_products
from crypto.compress import BinSumPacking
from crypto.schemes import (PublicKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                            public_key_from_n)
from messages.secureboost import HistogramShard, ShardHistogram, TreeCiphertexts
from messages.instance_space import decode_mask, encode_mask
from workers import ProtocolError

MAX_KEY_BYTES = 512
"""4096-bit moduli, the largest key a job may configure."""

HELPER_GRACE = 3.0
MIN_HELPER_WAIT = 10.0
"""Seconds a level waits at least for its helpers' answers (see ``LevelWork.gives_up_on_helpers``)."""

PackedFeature = tuple[np.ndarray, bytes]
"""One feature's filled mask (node, bin) and its filled bins' sums, packed, fixed width."""


@dataclass(frozen=True, slots=True)
class LevelData:
    """What summing a level needs: rows x features bin codes, the rows' E(g, h, 1) in the same
    order, and how many rows each built node has (its rows come one node after the other)."""

    codes: np.ndarray
    ciphertexts: list[mpz]
    node_rows: list[int]
    n_bins: int
    public: PublicKey
    packing: BinSumPacking

    def sum_features(self, features: list[int]) -> tuple[np.ndarray, bytes]:
        """The features' bin sums in one row-major pass, node-major (node, feature, bin): the
        filled mask and the filled bins' sums packed together."""
        offsets = np.concatenate([[0], np.cumsum(self.node_rows)]).astype(int).tolist()
        sums: list[mpz] = []
        for lo, hi in zip(offsets, offsets[1:]):
            sums += bin_products(self.codes[lo:hi][:, features], np.arange(lo, hi),
                                 self.ciphertexts, self.n_bins, self.public.cipher_modulus)
        return self.pack_sums(sums)

    def pack_sums(self, sums: list[mpz]) -> tuple[np.ndarray, bytes]:
        """Bin sums (node, feature, bin), however they were summed: the filled mask and the
        filled bins' sums packed together."""
        filled = np.array([c != 1 for c in sums], dtype=bool)  # 1 is the trivial E(0): empty
        # folded here, the bits above the sums are random; one per ciphertext, the key holder
        # folds them and needs them whole
        packed = self.packing.pack([c for c in sums if c != 1], self.public.cipher_modulus,
                                   self.public if self.packing.per_ciphertext > 1 else None)
        return filled, ciphertexts_to_bytes(packed, self.public)


def sum_claimed(data: LevelData, claim: Callable[[], int | None]) -> dict[int, PackedFeature]:
    """Sum and pack one feature after another, for as long as ``claim`` hands one out."""
    done: dict[int, PackedFeature] = {}
    while (feature := claim()) is not None:
        if not 0 <= feature < data.codes.shape[1] or feature in done:
            raise ProtocolError(f"claimed feature {feature} of {data.codes.shape[1]} twice or "
                                f"out of range")
        done[feature] = data.sum_features([feature])
    return done


MAX_TREE_CHUNKS = 65_536

_TREE_CIPHERTEXTS: dict[tuple[bytes, bytes], list[mpz]] = {}
"""This process's parsed copy of the latest tree's ciphertexts, by (SHA-256, key n): one tree."""
_TREE_CHUNKS: dict[tuple[bytes, int, int], dict[int, tuple[bytes, list[mpz]]]] = {}
"""Chunks of the tree being received, by (key n, tree, chunk count): one tree."""


def hold_tree_chunk(task: TreeCiphertexts) -> None:
    """Parse and range-check a chunk of a tree's ciphertexts; once the tree's chunks are all
    here, keep the tree (in place of the previous one) under its SHA-256 for its shards."""
    if len(task.n) > MAX_KEY_BYTES or not 0 <= task.chunk < task.n_chunks <= MAX_TREE_CHUNKS:
        raise ProtocolError(f"tree {task.tree}: chunk {task.chunk} of {task.n_chunks}, or key "
                            f"size out of range")
    public = public_key_from_n(task.scheme, int.from_bytes(task.n, "big"))
    key = (task.n, task.tree, task.n_chunks)
    if key not in _TREE_CHUNKS:  # another tree: what came of an earlier one will not be used
        _TREE_CHUNKS.clear()
        _TREE_CHUNKS[key] = {}
    chunks = _TREE_CHUNKS[key]
    if task.chunk in chunks:
        return  # a copy meant for another helper
    chunks[task.chunk] = (task.ciphertexts, ciphertexts_from_bytes(task.ciphertexts, public))
    if len(chunks) < task.n_chunks:
        return
    digest = hashlib.sha256()
    tree: list[mpz] = []
    for k in range(task.n_chunks):  # in order, chunk by chunk: never one joined copy
        raw, parsed = chunks.pop(k)
        digest.update(raw)
        tree += parsed
        del raw, parsed
    _keep_tree(digest.digest(), task.n, tree)


def _keep_tree(digest: bytes, n: bytes, ciphertexts: list[mpz]) -> None:
    _TREE_CHUNKS.clear()
    _TREE_CIPHERTEXTS.clear()  # one tree at a time
    _TREE_CIPHERTEXTS[(digest, n)] = ciphertexts


def shard_data(task: HistogramShard) -> LevelData | None:
    """Validate a helper's shard and make it the level's data; None if it names a tree whose
    ciphertexts this process does not hold (another helper took them, or it started later)."""
    if len(task.n) > MAX_KEY_BYTES or not 2 <= task.n_bins <= 256 or task.n_features < 1:
        raise ProtocolError("histogram shard: key size or bin count out of range")
    if any(r < 0 for r in task.rows):
        raise ProtocolError("histogram shard: negative row count")
    total = sum(task.rows)
    public = public_key_from_n(task.scheme, int.from_bytes(task.n, "big"))
    packing = BinSumPacking(task.cell_bits, task.per_ciphertext)
    packing.check_fits(public.plaintext_bits)
    if len(task.bins) != total * task.n_features or len(task.index) != 4 * total:
        raise ProtocolError(f"histogram shard: {len(task.bins)} bin codes and "
                            f"{len(task.index)} index bytes for {total} rows x "
                            f"{task.n_features} features")
    codes = np.frombuffer(task.bins, dtype=np.uint8).reshape(total, task.n_features)
    if codes.size and int(codes.max()) >= task.n_bins:
        raise ProtocolError("histogram shard: bin code out of range")
    if task.tree_ciphertexts:  # the tree's first level, with several helpers
        if hashlib.sha256(task.tree_ciphertexts).digest() != task.tree_digest:
            raise ProtocolError("histogram shard: the tree's ciphertexts fail their SHA-256")
        _keep_tree(task.tree_digest, task.n, ciphertexts_from_bytes(task.tree_ciphertexts, public))
    tree = _TREE_CIPHERTEXTS.get((task.tree_digest, task.n))  # range-checked under this n
    if tree is None:
        return None
    index = np.frombuffer(task.index, dtype="<u4")
    if index.size and int(index.max()) >= len(tree):
        raise ProtocolError(f"histogram shard: row index beyond the tree's {len(tree)} rows")
    return LevelData(codes, [tree[i] for i in index.tolist()], task.rows, task.n_bins, public,
                     packing)


def shard_result(task: HistogramShard, done: dict[int, PackedFeature],
                 started: float) -> ShardHistogram:
    """A helper's answer: the features it summed, their masks and packed sums, in order."""
    features = sorted(done)
    return ShardHistogram(
        tree=task.tree, depth=task.depth, shard=task.shard, features=features,
        filled=encode_mask(np.concatenate([done[f][0] for f in features])
                           if features else np.zeros(0, dtype=bool)),
        ciphertexts=b"".join(done[f][1] for f in features),
        seconds=time.perf_counter() - started)


@dataclass(slots=True)
class LevelWork:
    """One level's shared work: the claim pool, and the features summed so far by whom."""

    key: tuple[int, int]
    built: list[int]
    n_bins: int
    n_features: int
    pool: str
    tickets: int
    """Shards handed to helpers: one answer is awaited per shard."""
    data: LevelData
    """The coordinating process's own copy, to sum what no helper returned."""
    features: dict[int, PackedFeature] = field(default_factory=dict)
    together: PackedFeature | None = None
    """Every feature at once (no helpers): one row-major pass, packed together."""
    answered: set[int] = field(default_factory=set)
    by_helpers: int = 0
    helper_seconds: float = 0.0
    """The longest a helper took (parsing and summing), for the log."""
    summed_here: tuple[float, float] | None = None
    """When this process finished its share (``time.monotonic``) and how long it took."""

    def gives_up_on_helpers(self, now: float) -> bool:
        """Whether to stop waiting for helpers' answers and sum what they did not return here:
        once ``HELPER_GRACE`` times this process's own share has passed since it finished
        (at least ``MIN_HELPER_WAIT`` s). Claims give every process about the same share, so a
        helper that is still silent by then has died or stalled; a late answer is ignored."""
        if self.summed_here is None:
            return False
        finished, took = self.summed_here
        return now - finished > max(MIN_HELPER_WAIT, HELPER_GRACE * took)

    def add_answer(self, part: ShardHistogram, packing: BinSumPacking, width: int) -> None:
        """File a helper's features (a shard answered twice, after a redelivery, adds only
        what it summed anew)."""
        if not 0 < part.shard <= self.tickets:
            raise ProtocolError(f"unexpected histogram shard {part.shard} of {self.tickets}")
        cells = len(self.built) * self.n_bins
        filled = decode_mask(part.filled, cells * len(part.features))
        first = 0
        for k, feature in enumerate(part.features):
            if not 0 <= feature < self.n_features or feature in self.features:
                raise ProtocolError(f"histogram shard {part.shard}: feature {feature} summed "
                                    f"twice or out of range")
            mask = filled[k * cells:(k + 1) * cells]
            size = packing.n_ciphertexts(int(mask.sum())) * width
            self.features[feature] = (mask, part.ciphertexts[first:first + size])
            first += size
        if first != len(part.ciphertexts):
            raise ProtocolError(f"histogram shard {part.shard}: {len(part.ciphertexts)} bytes "
                                f"of packed sums, expected {first}")
        self.answered.add(part.shard)
        self.by_helpers += len(part.features)
        self.helper_seconds = max(self.helper_seconds, part.seconds)

    def missing(self) -> list[int]:
        if self.together is not None:
            return []
        return [f for f in range(self.n_features) if f not in self.features]

    def merged(self) -> tuple[list[int], np.ndarray, bytes]:
        """Group widths (one feature each, or all in one), filled mask and packed sums, in
        feature order."""
        if self.together is not None:
            return [self.n_features], self.together[0], self.together[1]
        order = range(self.n_features)
        return ([1] * self.n_features, np.concatenate([self.features[f][0] for f in order]),
                b"".join(self.features[f][1] for f in order))

