"""Histogram shards: however a level is cut between processes, the key holder gets the same sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.compress import BinSumPacking
from crypto.paillier import (PaillierPrivateKey, PaillierPublicKey, ciphertexts_from_bytes,
                             ciphertexts_to_bytes, generate_keypair)
from messages.bodies import HistogramShard
from workers import ProtocolError
from workers.shards import (LevelWork, ShardBalance, merge_shards, plan_ranges, shard_histograms,
                            sum_range)

N_BINS = 5
CELL_BITS = 40  # row values below 2**20, at most 2**10 rows: sums fit with room to spare

shares_st = st.lists(st.floats(0.01, 10.0), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(n_features=st.integers(1, 12), n_rows=st.integers(0, 400), shares=shares_st)
def test_a_plan_covers_every_cell_once_in_order(n_features: int, n_rows: int,
                                                shares: list[float]) -> None:
    ranges = plan_ranges(n_features, n_rows, shares)

    assert 1 <= len(ranges) <= len(shares)
    covered = []  # (feature, lo, hi) in plan order
    for shard in ranges:
        for column in range(shard.n_features):
            lo, hi = shard.rows_of(column)
            assert 0 <= lo < hi <= n_rows or n_rows == 0
            covered.append((shard.first + column, lo, hi))
    position = (0, 0)
    for feature, lo, hi in covered:
        assert (feature, lo) == position or (position[1] == n_rows and (feature, lo) ==
                                             (position[0] + 1, 0))
        position = (feature, hi)
    assert position in ((n_features - 1, n_rows), (n_features, 0))


def test_a_plan_follows_the_shares() -> None:
    ranges = plan_ranges(10, 1000, [0.55, 0.45])

    assert [(r.first, r.n_features, r.row_from, r.row_to) for r in ranges] == [
        (0, 6, 0, 500), (5, 5, 500, 1000)]
    assert ranges[0].partial_columns == [5] and ranges[1].partial_columns == [0]


def test_a_cut_near_a_feature_edge_moves_to_it() -> None:
    ranges = plan_ranges(10, 1000, [0.502, 0.498])

    assert [(r.first, r.n_features) for r in ranges] == [(0, 5), (5, 5)]
    assert all(not r.partial_columns for r in ranges)


def test_the_balance_gives_a_late_helper_less() -> None:
    balance = ShardBalance()
    shares = balance.shares(1)

    balance.learn(shares, own_end=1.0, helpers_end=1.5)

    assert shares == [0.5, 0.5]
    assert balance.shares(1)[1] < 0.5
    balance.learn(balance.shares(1), own_end=1.0, helpers_end=1e-9)
    assert balance.helper_speed <= 20.0


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


def _decrypt(private: PaillierPrivateKey, widths: list[int], filled: np.ndarray,
             ciphertexts: bytes, nodes: int, packing: BinSumPacking) -> np.ndarray:
    """What the key holder reads (workers.active._decrypt_histograms, without gradients)."""
    plain = private.decrypt_batch(ciphertexts_from_bytes(ciphertexts, private.public_key))
    blocks, first, start = [], 0, 0
    for features in widths:
        cells = nodes * features * N_BINS
        seg = np.flatnonzero(filled[first:first + cells])
        count = packing.n_ciphertexts(seg.size)
        sums = np.zeros(cells, dtype=np.int64)
        sums[seg] = packing.unpack(plain[start:start + count], seg.size)
        blocks.append(sums.reshape(nodes, features, N_BINS))
        first, start = first + cells, start + count
    return np.concatenate(blocks, axis=1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n_features=st.integers(1, 6),
       node_rows=st.lists(st.integers(0, 40), min_size=1, max_size=3), shares=shares_st)
def test_any_cut_gives_the_key_holder_the_same_sums(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey], seed: int, n_features: int,
        node_rows: list[int], shares: list[float]) -> None:
    # Prepare: a level's codes and encrypted row values, cut by the shares
    public, private = keypair
    codes, values, cts = _level(seed, public, private, n_features, node_rows)
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    rows = sum(node_rows)
    work = LevelWork(key=(0, 1), built=list(range(len(node_rows))), n_bins=N_BINS,
                     n_features=n_features, ranges=plan_ranges(n_features, rows, shares),
                     shares=shares)

    # Execute: the first range here, the others as helpers get them (through their message)
    n = int(public.n).to_bytes(64, "big")
    for k, shard in enumerate(work.ranges):
        columns = codes[:, shard.first:shard.first + shard.n_features]
        if k == 0:
            work.parts[0] = sum_range(columns, node_rows, cts, shard, N_BINS, public, packing,
                                      (0, 1, 0))
        else:
            work.parts[k] = shard_histograms(HistogramShard(
                tree=0, depth=1, shard=k, n=n, n_bins=N_BINS, n_features=shard.n_features,
                rows=node_rows, bins=np.ascontiguousarray(columns).tobytes(),
                ciphertexts=ciphertexts_to_bytes(cts, public), cell_bits=packing.cell_bits,
                per_ciphertext=packing.per_ciphertext, row_from=shard.row_from,
                row_to=shard.row_to))
    widths, filled, ciphertexts = merge_shards(work, public, packing)

    # Assert: the plaintext histograms of the level, empty bins marked empty
    got = _decrypt(private, widths, filled, ciphertexts, len(node_rows), packing)
    want = np.zeros((len(node_rows), n_features, N_BINS), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(node_rows)]).astype(int)
    for node in range(len(node_rows)):
        for row in range(offsets[node], offsets[node + 1]):
            for feature in range(n_features):
                want[node, feature, codes[row, feature]] += values[row]
    assert np.array_equal(got, want)
    assert np.array_equal(filled.reshape(-1), _filled_in_group_order(want, widths))


def _filled_in_group_order(want: np.ndarray, widths: list[int]) -> np.ndarray:
    out, first = [], 0
    for width in widths:
        out.append((want[:, first:first + width, :] != 0).reshape(-1))
        first += width
    return np.concatenate(out)


def test_a_shard_with_rows_out_of_range_is_refused(
        keypair: tuple[PaillierPublicKey, PaillierPrivateKey]) -> None:
    public, private = keypair
    codes, _, cts = _level(1, public, private, 2, [4])
    packing = BinSumPacking.for_key(CELL_BITS, public.n.bit_length())
    shard = HistogramShard(tree=0, depth=0, shard=1, n=int(public.n).to_bytes(64, "big"),
                           n_bins=N_BINS, n_features=2, rows=[4], bins=codes.tobytes(),
                           ciphertexts=ciphertexts_to_bytes(cts, public),
                           cell_bits=packing.cell_bits, per_ciphertext=packing.per_ciphertext,
                           row_from=5, row_to=4)

    with pytest.raises(ProtocolError, match="rows 5..4 of 4"):
        shard_histograms(shard)
