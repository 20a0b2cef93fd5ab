"""A passive party's histogram shards: how one level's work is cut, summed and put together.

The work of a level is a feature-major sequence of (feature, row) cells, the rows being the
built nodes' rows one node after the other. It is cut into one contiguous range per process of
the party, the coordinating process's first, sized by each process's measured speed
(:class:`ShardBalance`), so that all finish together even when a helper starts later (its data
has to travel to it) or runs slower. A cut may fall inside a feature: each side then returns
that feature's sums unpacked, and the coordinating process multiplies them (adding under
Paillier) before packing them. Products modulo n^2 do not depend on how the rows were grouped,
so the decrypted sums, and the model, are the same however the work is cut.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from crypto._gmp import mpz
from crypto.compress import BinSumPacking
from crypto.paillier import (PaillierPublicKey, ciphertexts_from_bytes, ciphertexts_to_bytes,
                             public_key_from_n)
from messages.bodies import HistogramShard, ShardHistogram
from messages.instance_space import decode_mask, encode_mask
from workers import ProtocolError

MAX_KEY_BYTES = 512
"""4096-bit moduli, the largest key a job may configure."""
SNAP = 0.1
"""A cut closer than this fraction of a feature to the feature's edge moves to the edge: a split
feature costs an unpacked trip and a merge, not worth it for a few rows."""


@dataclass(frozen=True, slots=True)
class ShardRange:
    """Features ``first .. first + n_features - 1`` of a level with ``n_rows`` rows: the first
    one from row ``row_from``, the last one up to row ``row_to``, the others whole."""

    first: int
    n_features: int
    row_from: int
    row_to: int
    n_rows: int

    def rows_of(self, column: int) -> tuple[int, int]:
        """The rows ``[lo, hi)`` of the level that column ``column`` of the range covers."""
        lo = self.row_from if column == 0 else 0
        hi = self.row_to if column == self.n_features - 1 else self.n_rows
        return lo, hi

    def is_whole(self, column: int) -> bool:
        return self.rows_of(column) == (0, self.n_rows)

    @property
    def partial_columns(self) -> list[int]:
        return [c for c in range(self.n_features) if not self.is_whole(c)]


def plan_ranges(n_features: int, n_rows: int, shares: list[float]) -> list[ShardRange]:
    """Cut a level into contiguous ranges of cells, one per share (empty ones are left out)."""
    if n_rows == 0 or len(shares) == 1:
        return [ShardRange(0, n_features, 0, n_rows, n_rows)]
    total, cuts, acc = n_features * n_rows, [0], 0.0
    for share in shares[:-1]:
        acc += share / sum(shares)
        cut = round(acc * total)
        edge = round(cut / n_rows) * n_rows
        if abs(cut - edge) < SNAP * n_rows:
            cut = edge
        cuts.append(min(max(cut, cuts[-1]), total))
    cuts.append(total)
    ranges = []
    for start, stop in zip(cuts, cuts[1:]):
        if stop > start:
            first, last = start // n_rows, (stop - 1) // n_rows
            ranges.append(ShardRange(first, last - first + 1, start % n_rows,
                                     (stop - 1) % n_rows + 1, n_rows))
    return ranges


@dataclass(slots=True)
class ShardBalance:
    """How fast a helper process gets through a level's cells, relative to the coordinating
    process, both timed from the moment the level is handed out (so a helper's wait for its
    data counts against it). Learnt level by level; the shares follow it."""

    helper_speed: float = 1.0

    def shares(self, helpers: int) -> list[float]:
        """The coordinating process's share of a level, then each helper's."""
        whole = 1.0 + helpers * self.helper_speed
        return [1.0 / whole] + [self.helper_speed / whole] * helpers

    def learn(self, shares: list[float], own_end: float, helpers_end: float) -> None:
        """Move the speed halfway (geometrically) towards what this level measured."""
        if len(shares) < 2 or min(own_end, helpers_end) <= 0:
            return
        measured = (shares[1] / helpers_end) / (shares[0] / own_end)
        self.helper_speed = min(20.0, max(0.05, math.sqrt(self.helper_speed * measured)))


@dataclass(slots=True)
class LevelWork:
    """One level's shards: the plan, which results are back, and timings for the balance."""

    key: tuple[int, int]
    built: list[int]
    n_bins: int
    n_features: int
    ranges: list[ShardRange]
    shares: list[float]
    started: float = field(default_factory=time.perf_counter)
    handed_out: float = 0.0
    own_end: float = 0.0
    """Seconds from ``started``: helpers' data published, own range summed."""
    parts: dict[int, ShardHistogram] = field(default_factory=dict)

    @property
    def n_shards(self) -> int:
        return len(self.ranges)

    def helpers_end(self) -> float:
        """When the last helper finished, seen from ``started``: when its result arrived if
        this process had to wait for it, else (it was early) its own report of its work."""
        now = time.perf_counter() - self.started
        if now - self.own_end > 0.02:
            return now
        reported = max(p.seconds for k, p in self.parts.items() if k > 0)
        return min(self.own_end, self.handed_out + reported)


def sum_range(codes: np.ndarray, node_rows: list[int], ciphertexts: list[mpz],
              shard: ShardRange, n_bins: int, public: PaillierPublicKey,
              packing: BinSumPacking, key: tuple[int, int, int]) -> ShardHistogram:
    """Homomorphic bin sums of one range (``key``: tree, depth, shard): whole features packed,
    split ones unpacked.

    ``codes`` holds the level's rows x the range's features, ``ciphertexts`` the rows' E(g, h, 1)
    in the same order, ``node_rows`` how many rows each built node has.
    """
    started = time.perf_counter()
    offsets = np.concatenate([[0], np.cumsum(node_rows)]).astype(int).tolist()
    nodes = list(zip(offsets, offsets[1:]))
    whole = [c for c in range(shard.n_features) if shard.is_whole(c)]
    sums: list[mpz] = []
    for lo, hi in nodes:
        sums += _node_histogram(codes[lo:hi][:, whole], np.arange(lo, hi), ciphertexts, n_bins,
                                public.nsquare)
    partial: list[mpz] = []
    for column in shard.partial_columns:
        a, b = shard.rows_of(column)
        for lo, hi in nodes:  # this node's rows within [a, b)
            lo, hi = max(a, lo), min(b, hi)
            hi = max(lo, hi)
            partial += _node_histogram(codes[lo:hi, [column]], np.arange(lo, hi), ciphertexts,
                                       n_bins, public.nsquare)
    filled = np.array([c != 1 for c in sums], dtype=bool)  # 1 is the trivial E(0): empty bin
    packed = packing.pack([c for c in sums if c != 1], public.nsquare)
    tree, depth, index = key
    return ShardHistogram(tree=tree, depth=depth, shard=index, filled=encode_mask(filled),
                          ciphertexts=ciphertexts_to_bytes(packed, public),
                          partial_columns=shard.partial_columns,
                          partial=ciphertexts_to_bytes(partial, public),
                          seconds=time.perf_counter() - started)


def shard_histograms(task: HistogramShard) -> ShardHistogram:
    """A helper's shard: validate it, then sum its range (:func:`sum_range`)."""
    if len(task.n) > MAX_KEY_BYTES or not 2 <= task.n_bins <= 256 or task.n_features < 1:
        raise ProtocolError("histogram shard: key size or bin count out of range")
    if any(r < 0 for r in task.rows):
        raise ProtocolError("histogram shard: negative row count")
    total = sum(task.rows)
    if not (0 <= task.row_from <= total and 0 <= task.row_to <= total
            and (task.n_features > 1 or task.row_from <= task.row_to)):
        raise ProtocolError(f"histogram shard: rows {task.row_from}..{task.row_to} of {total}")
    public = public_key_from_n(int.from_bytes(task.n, "big"))
    packing = BinSumPacking(task.cell_bits, task.per_ciphertext)
    packing.check_fits(int(public.n).bit_length())
    if len(task.bins) != total * task.n_features:
        raise ProtocolError(f"histogram shard: {len(task.bins)} bin codes for {total} rows x "
                            f"{task.n_features} features")
    codes = np.frombuffer(task.bins, dtype=np.uint8).reshape(total, task.n_features)
    if codes.size and int(codes.max()) >= task.n_bins:
        raise ProtocolError("histogram shard: bin code out of range")
    cts = ciphertexts_from_bytes(task.ciphertexts, public)  # checks width and range
    if len(cts) != total:
        raise ProtocolError(f"histogram shard: {len(cts)} ciphertexts for {total} rows")
    shard = ShardRange(-1, task.n_features, task.row_from, task.row_to, total)
    return sum_range(codes, task.rows, cts, shard, task.n_bins, public, packing,
                     (task.tree, task.depth, task.shard))


def merge_shards(work: LevelWork, public: PaillierPublicKey,
                 packing: BinSumPacking) -> tuple[list[int], np.ndarray, bytes]:
    """The level's histograms in feature order: per group of features packed together (each
    shard's whole features; each split feature, its parts multiplied and packed here), the
    group widths, the filled mask and the packed ciphertexts."""
    cells = len(work.built) * work.n_bins
    width = public.ciphertext_bytes
    split: dict[int, list[mpz]] = {}
    groups: list[tuple[int, int, np.ndarray, bytes]] = []  # first feature, width, mask, bytes
    for k, shard in enumerate(work.ranges):
        part = work.parts[k]
        if part.partial_columns != shard.partial_columns:
            raise ProtocolError(f"histogram shard {k}: split columns {part.partial_columns}, "
                                f"expected {shard.partial_columns}")
        partial = ciphertexts_from_bytes(part.partial, public)
        if len(partial) != len(shard.partial_columns) * cells:
            raise ProtocolError(f"histogram shard {k}: {len(partial)} split sums")
        for i, column in enumerate(shard.partial_columns):
            own = partial[i * cells:(i + 1) * cells]
            feature = shard.first + column
            split[feature] = own if feature not in split else [
                a * b % public.nsquare for a, b in zip(split[feature], own)]
        whole = [c for c in range(shard.n_features) if shard.is_whole(c)]
        if whole:
            filled = decode_mask(part.filled, cells * len(whole))
            if len(part.ciphertexts) != packing.n_ciphertexts(int(filled.sum())) * width:
                raise ProtocolError(f"histogram shard {k}: {len(part.ciphertexts)} bytes for "
                                    f"{int(filled.sum())} packed sums")
            groups.append((shard.first + whole[0], len(whole), filled, part.ciphertexts))
    for feature, sums in split.items():
        filled = np.array([c != 1 for c in sums], dtype=bool)
        packed = packing.pack([c for c in sums if c != 1], public.nsquare)
        groups.append((feature, 1, filled, ciphertexts_to_bytes(packed, public)))
    groups.sort(key=lambda g: g[0])
    return ([g[1] for g in groups], np.concatenate([g[2] for g in groups]),
            b"".join(g[3] for g in groups))


def _node_histogram(bins: np.ndarray, enc_index: np.ndarray, ciphertexts: list[mpz],
                    n_bins: int, nsquare: mpz) -> list[mpz]:
    """Homomorphic bin sums (products of ciphertexts) of one node, features x bins.

    Row by row: each ciphertext is read once and multiplied into one accumulator per feature,
    which all stay in cache; a pass per feature would stream every ciphertext once per feature.
    """
    n_features = bins.shape[1]
    acc: list[mpz | None] = [None] * (n_features * n_bins)
    slots = (bins.astype(np.int64) + np.arange(n_features) * n_bins).tolist()
    for row, row_slots in zip(enc_index.tolist(), slots, strict=True):
        c = ciphertexts[row]
        for slot in row_slots:
            a = acc[slot]
            acc[slot] = c if a is None else a * c % nsquare
    one = mpz(1)  # the trivial encryption of 0 marks an empty bin
    return [one if a is None else a for a in acc]
