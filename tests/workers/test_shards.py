"""Histogram work shared by claims: however the features fall, the key holder gets the same sums."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import CryptoError
from crypto.compress import BinSumPacking
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes, generate_keypair)
from messages.secureboost import HistogramShard, TreeCiphertexts
from messages.transport import MemoryHub, MemoryTransport
from workers import ProtocolError
from workers.shards import (HELPER_GRACE, MIN_HELPER_WAIT, LevelData, LevelWork,
                            hold_tree_chunk, shard_data, shard_result, sum_claimed)

N_BINS = 5
CELL_BITS = 40  # row values below 2**20, at most 2**10 rows: sums fit with room to spare


@pytest.fixture(scope="module")
def keypair() -> tuple[PaillierPublicKey, PaillierPrivateKey]:
    return generate_keypair(512)


def _level(seed: int, public: PaillierPublicKey, private: PaillierPrivateKey, n_features: int,
           node_rows: list[int]) -> tuple[np.ndarray, list[int], np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = sum(node_rows)
    codes = rng.integers(0, N_BINS, size=(rows, n_features), dtype=np.uint8)
    codes[:, 0] = 0  # one feature with empty bins
    values = rng.integers(1, 1 << 20, size=rows)
    return codes, [int(v) for v in values], private.encrypt_batch([int(v) for v in values])


def _hold(public: PaillierPublicKey, cts: list[int], tree: int = 0, chunks: int = 3) -> bytes:
    """Hand a helper a tree's ciphertexts chunk by chunk, last chunk first (as copies of them
    may come); returns their SHA-256."""
    table = ciphertexts_to_bytes(cts, public)
    cuts = np.linspace(0, len(cts), chunks + 1).astype(int) * public.ciphertext_bytes
    for k in reversed(range(chunks)):
        hold_tree_chunk(TreeCiphertexts(tree=tree, chunk=k, n_chunks=chunks,
                                        n=int(public.n).to_bytes(64, "big"),
                                        ciphertexts=table[cuts[k]:cuts[k + 1]]))
    return hashlib.sha256(table).digest()


def _task(public: PaillierPublicKey, packing: BinSumPacking, codes: np.ndarray, cts: list[int],
          node_rows: list[int], *, rows: np.ndarray | None = None, depth: int = 0,
          with_tree: bool = False) -> HistogramShard:
    """A helper's shard of a level whose rows are ``rows`` of the tree (default: all, in order);
    ``with_tree``: it brings the tree's ciphertexts (a first level, several helpers)."""
    rows = np.arange(len(cts)) if rows is None else rows
    return HistogramShard(tree=0, depth=depth, shard=1,
                          n=int(public.n).to_bytes(64, "big"), n_bins=N_BINS,
                          n_features=codes.shape[1], rows=node_rows,
                          bins=np.ascontiguousarray(codes[rows]).tobytes(),
                          index=rows.astype("<u4").tobytes(),
                          tree_digest=hashlib.sha256(ciphertexts_to_bytes(cts, public)).digest(),
                          tree_ciphertexts=ciphertexts_to_bytes(cts, public) if with_tree else b"",
                          cell_bits=packing.cell_bits, per_ciphertext=packing.per_ciphertext,
                          claims="pool")


def test_shards_sum_from_the_tree_the_helper_holds(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(7, public, private, 3, [10])
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    deeper = np.array([8, 2, 5])
    _hold(public, cts)

    first = shard_data(_task(public, packing, codes, cts, [10]))
    later = shard_data(_task(public, packing, codes, cts, [3], rows=deeper, depth=1))

    assert first is not None and later is not None
    assert first.ciphertexts == cts
    assert later.ciphertexts == [cts[k] for k in deeper]
    assert np.array_equal(later.codes, codes[deeper])
    other = _level(8, public, private, 3, [10])[2]  # a tree this process never received
    assert shard_data(_task(public, packing, codes, other, [10])) is None
    other_key = generate_keypair(512)[0]  # the same digest under another key: not this tree
    assert shard_data(replace(_task(public, packing, codes, cts, [10]),
                              n=int(other_key.n).to_bytes(64, "big"))) is None


def test_with_several_helpers_the_first_level_brings_the_tree(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(11, public, private, 2, [5])
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    first = _task(public, packing, codes, cts, [5], with_tree=True)

    data = shard_data(first)
    later = shard_data(_task(public, packing, codes, cts, [2], rows=np.array([4, 1]), depth=1))

    assert data is not None and data.ciphertexts == cts
    assert later is not None and later.ciphertexts == [cts[4], cts[1]]
    with pytest.raises(ProtocolError, match="fail their SHA-256"):
        shard_data(replace(first, tree_digest=b"\x00" * 32))


def test_a_tree_is_held_only_once_all_its_chunks_came(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(9, public, private, 2, [6])
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    n = int(public.n).to_bytes(64, "big")
    _hold(public, cts)
    table = ciphertexts_to_bytes(_level(10, public, private, 2, [6])[2], public)
    half = 3 * public.ciphertext_bytes

    hold_tree_chunk(TreeCiphertexts(1, 0, 2, n, table[:half]))
    hold_tree_chunk(TreeCiphertexts(1, 0, 2, n, table[:half]))  # a second copy changes nothing
    assert shard_data(_task(public, packing, codes, cts, [6])) is not None  # tree 0 still held
    hold_tree_chunk(TreeCiphertexts(1, 1, 2, n, table[half:]))
    assert shard_data(_task(public, packing, codes, cts, [6])) is None  # tree 1 replaced it

    with pytest.raises(CryptoError, match="not a multiple"):
        hold_tree_chunk(TreeCiphertexts(2, 0, 2, n, table[:half - 1]))
    with pytest.raises(ProtocolError, match="chunk 2 of 2"):
        hold_tree_chunk(TreeCiphertexts(2, 2, 2, n, table[:half]))
    beyond = (int(public.nsquare) + 1).to_bytes(public.ciphertext_bytes, "big")
    with pytest.raises(CryptoError):
        hold_tree_chunk(TreeCiphertexts(2, 0, 2, n, beyond))


def _decrypt(private: PaillierPrivateKey, widths: list[int], filled: np.ndarray,
             ciphertexts: bytes, nodes: int, packing: BinSumPacking) -> np.ndarray:
    """What the key holder reads (workers.vertical.decryption.decrypt_histograms, without
    gradients)."""
    plain = private.decrypt_batch(ciphertexts_from_bytes(ciphertexts, private.public_key))
    blocks, first, start = [], 0, 0
    for features in widths:
        cells = nodes * features * N_BINS
        seg = np.flatnonzero(filled[first:first + cells])
        count = packing.n_ciphertexts(seg.size)
        sums = np.zeros(cells, dtype=np.int64)
        sums[seg] = packing.unpack(plain[start:start + count], seg.size, masked=True)
        blocks.append(sums.reshape(nodes, features, N_BINS))
        first, start = first + cells, start + count
    return np.concatenate(blocks, axis=1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n_features=st.integers(1, 6),
       node_rows=st.lists(st.integers(0, 40), min_size=1, max_size=3),
       takers=st.lists(st.sampled_from(["here", "helper", "lost"]), min_size=6, max_size=6))
def test_however_features_are_claimed_the_key_holder_gets_the_same_sums(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey], seed: int, n_features: int,
        node_rows: list[int], takers: list[str]) -> None:
    # Prepare: a level, and who claims each feature ("lost": a helper that never answers)
    public, private = keypair
    codes, values, cts = _level(seed, public, private, n_features, node_rows)
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    data = LevelData(codes, cts, node_rows, N_BINS, public, packing)
    _hold(public, cts)
    task = _task(public, packing, codes, cts, node_rows)
    work = LevelWork(key=(0, 1), built=list(range(len(node_rows))), n_bins=N_BINS,
                     n_features=n_features, pool="pool", tickets=1, data=data)

    # Execute: each process claims what the draw gives it; the coordinator merges
    def claims(who: str) -> Iterator[int | None]:
        yield from (f for f in range(n_features) if takers[f] == who)
        yield None
    work.features = sum_claimed(data, claims("here").__next__)
    helper_data = shard_data(task)
    assert helper_data is not None
    helper = sum_claimed(helper_data, claims("helper").__next__)
    work.add_answer(shard_result(task, helper, 0.0), packing, public.ciphertext_bytes)
    for feature in work.missing():
        work.features[feature] = data.sum_features([feature])
    widths, filled, ciphertexts = work.merged()

    # Assert: the plaintext histograms of the level, empty bins marked empty
    got = _decrypt(private, widths, filled, ciphertexts, len(node_rows), packing)
    assert np.array_equal(got, _histograms(codes, values, node_rows, n_features))
    assert np.array_equal(filled, (got != 0).transpose(1, 0, 2).reshape(-1))
    assert work.by_helpers == takers[:n_features].count("helper")


def test_all_features_at_once_give_the_same_sums(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    node_rows = [7, 0, 12]
    codes, values, cts = _level(3, public, private, 4, node_rows)
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    data = LevelData(codes, cts, node_rows, N_BINS, public, packing)
    work = LevelWork(key=(0, 1), built=[1, 2, 3], n_bins=N_BINS, n_features=4, pool="",
                     tickets=0, data=data, together=data.sum_features([0, 1, 2, 3]))

    widths, filled, ciphertexts = work.merged()

    assert widths == [4]
    got = _decrypt(private, widths, filled, ciphertexts, 3, packing)
    assert np.array_equal(got, _histograms(codes, values, node_rows, 4))


def _histograms(codes: np.ndarray, values: list[int], node_rows: list[int],
                n_features: int) -> np.ndarray:
    want = np.zeros((len(node_rows), n_features, N_BINS), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(node_rows)]).astype(int)
    for node in range(len(node_rows)):
        for row in range(offsets[node], offsets[node + 1]):
            for feature in range(n_features):
                want[node, feature, codes[row, feature]] += values[row]
    return want


def test_a_feature_answered_twice_is_refused(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(1, public, private, 2, [4])
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    data = LevelData(codes, cts, [4], N_BINS, public, packing)
    task = _task(public, packing, codes, cts, [4])
    work = LevelWork(key=(0, 0), built=[0], n_bins=N_BINS, n_features=2, pool="pool",
                     tickets=1, data=data, features={0: data.sum_features([0])})
    answer = shard_result(task, {0: data.sum_features([0])}, 0.0)

    with pytest.raises(ProtocolError, match="feature 0 summed twice"):
        work.add_answer(answer, packing, public.ciphertext_bytes)


def _claim_all(transport: MemoryTransport, pool: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    got = []
    while (unit := transport.claim(pool)) is not None:
        got.append(unit)
    out.put(got)


def test_memory_claims_hand_each_unit_to_one_process() -> None:
    hub = MemoryHub(["host"], helpers={"host": 2})
    coordinator = hub.endpoint("host")
    pool = coordinator.open_claims(5000)
    out = hub.context.Queue()
    procs = [hub.context.Process(target=_claim_all, args=(hub.endpoint("host", helper=True),
                                                          pool, out)) for _ in range(2)]
    for proc in procs:
        proc.start()
    mine = []
    while (unit := coordinator.claim(pool)) is not None:
        mine.append(unit)
    theirs = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(30)

    assert sorted(mine + theirs[0] + theirs[1]) == list(range(5000))
    newer = coordinator.open_claims(2)
    assert coordinator.claim(pool) is None  # an older pool is over
    coordinator.close_claims(newer)
    assert coordinator.claim(newer) is None


def test_a_level_stops_waiting_for_silent_helpers_after_a_grace_period(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(12, public, private, 2, [3])
    data = LevelData(codes, cts, [3], N_BINS, public,
                     BinSumPacking.for_key(CELL_BITS, public.n.bit_length()))
    work = LevelWork(key=(0, 0), built=[0], n_bins=N_BINS, n_features=2, pool="pool",
                     tickets=1, data=data)
    assert not work.gives_up_on_helpers(1e9)  # this process has not finished its share yet

    work.summed_here = (100.0, 1.0)  # finished at t=100 after 1 s of summing
    assert not work.gives_up_on_helpers(100.0 + MIN_HELPER_WAIT - 0.1)
    assert work.gives_up_on_helpers(100.0 + MIN_HELPER_WAIT + 0.1)
    work.summed_here = (100.0, 2 * MIN_HELPER_WAIT)  # a long share: wait in proportion
    assert not work.gives_up_on_helpers(100.0 + 2 * MIN_HELPER_WAIT + 1)
    assert work.gives_up_on_helpers(100.0 + HELPER_GRACE * 2 * MIN_HELPER_WAIT + 0.1)
