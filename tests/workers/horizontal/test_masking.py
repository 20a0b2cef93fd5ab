"""Pairwise masks cancel in the sum, change per round, and look uniform on their own."""

from __future__ import annotations

import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from boosting.binning import apply_cuts, fit_cuts
from boosting.fixedpoint import quantize
from boosting.hist import build_histograms
from workers import ProtocolError
from workers.pairwise_masks import (SEAL_BYTES, MaskError, MaskKey, MaskRound, mask_vector,
                                        open_seal_share, pair_secret, round_seal_key,
                                        seal_share, seal_vector, unmask_sum, unseal_sum)

JOB = "job-7"
ROUND = MaskRound(JOB, "histograms", tree=3, depth=1, attempt=0)
DATA = Path("/work/shared/data/default_credit_homo_guest.csv")


def _federation(names: list[str], seeded: bool = False) -> dict[str, dict[str, bytes]]:
    """Every member's secrets with every other member, agreed over real X25519 keys (fixed
    keys if ``seeded``, so that statistical tests cannot flake)."""
    keys = {name: MaskKey(X25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32)) if seeded
            else MaskKey.generate() for i, name in enumerate(names)}
    public = {name: key.public_bytes() for name, key in keys.items()}
    return {me: {peer: pair_secret(keys[me], public[peer], JOB, me, peer)
                 for peer in names if peer != me} for me in names}


@pytest.fixture(scope="module")
def five() -> dict[str, dict[str, bytes]]:
    return _federation(["alice", "bob", "carol", "dave", "erin"])


@pytest.fixture(scope="module")
def fixed_five() -> dict[str, dict[str, bytes]]:
    return _federation(["alice", "bob", "carol", "dave", "erin"], seeded=True)


def _masked_sum(secrets: dict[str, dict[str, bytes]], values: dict[str, np.ndarray],
                round_: MaskRound) -> np.ndarray:
    live = set(values)
    return unmask_sum([mask_vector(values[m], m, {p: s for p, s in secrets[m].items() if p in live},
                                   round_) for m in sorted(values)])


names = st.lists(st.text(min_size=1, max_size=8), min_size=3, max_size=5, unique=True)


@settings(max_examples=40, deadline=None)
@given(members=st.one_of(names.filter(lambda n: len(n) == 3), names.filter(lambda n: len(n) == 5)),
       length=st.integers(0, 200), seed=st.integers(0, 2**32 - 1))
def test_masked_sum_is_the_plain_sum(members: list[str], length: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = {m: rng.integers(-2**62, 2**62, size=length, dtype=np.int64, endpoint=True)
              for m in members}
    secrets = _federation(members)

    total = _masked_sum(secrets, values, ROUND)

    # equal mod 2^64 (numpy's int64 sum wraps too); it is the true sum whenever that fits
    np.testing.assert_array_equal(total, np.sum(list(values.values()), axis=0, dtype=np.int64))


def test_extreme_values_wrap_and_cancel(five: dict[str, dict[str, bytes]]) -> None:
    edge = np.array([2**62, -(2**62), 2**63 - 1, -(2**63), 0], dtype=np.int64)
    values = {m: np.roll(edge, i) for i, m in enumerate(["alice", "bob", "carol"])}
    expected = np.zeros(5, dtype=np.int64)
    for v in values.values():
        expected += v  # int64 wraps the same way mod 2^64

    np.testing.assert_array_equal(_masked_sum(five, values, ROUND), expected)


def test_every_round_field_changes_the_mask(five: dict[str, dict[str, bytes]]) -> None:
    values = np.zeros(64, dtype=np.int64)
    rounds = [ROUND, MaskRound("job-8", "histograms", 3, 1, 0), MaskRound(JOB, "totals", 3, 1, 0),
              MaskRound(JOB, "histograms", 4, 1, 0), MaskRound(JOB, "histograms", 3, 2, 0),
              MaskRound(JOB, "histograms", 3, 1, 1)]

    masks = [mask_vector(values, "bob", five["bob"], r).tobytes() for r in rounds]

    assert len(set(masks)) == len(rounds)
    assert mask_vector(values, "bob", five["bob"], ROUND).tobytes() == masks[0]  # deterministic


def test_pairs_get_different_streams(five: dict[str, dict[str, bytes]]) -> None:
    zero = np.zeros(16, dtype=np.int64)
    # alice masks only with bob, or only with carol: the two masks must differ
    with_bob = mask_vector(zero, "alice", {"bob": five["alice"]["bob"]}, ROUND)
    with_carol = mask_vector(zero, "alice", {"carol": five["alice"]["carol"]}, ROUND)
    assert with_bob.tobytes() != with_carol.tobytes()


def test_a_member_left_out_of_a_round_still_cancels(five: dict[str, dict[str, bytes]]) -> None:
    rng = np.random.default_rng(1)
    values = {m: rng.integers(-2**40, 2**40, size=50) for m in ["alice", "bob", "dave", "erin"]}
    retry = MaskRound(JOB, "histograms", 3, 1, attempt=1)  # carol dropped: redo without her

    total = _masked_sum(five, values, retry)

    np.testing.assert_array_equal(total, np.sum(list(values.values()), axis=0))


def test_a_dropped_member_left_in_the_secrets_breaks_the_sum(five: dict[str, dict[str, bytes]]
                                                             ) -> None:
    values = {m: np.arange(10, dtype=np.int64) for m in ["alice", "bob", "carol"]}
    masked = [mask_vector(values[m], m, five[m], ROUND) for m in values]  # masks with dave, erin
    assert not np.array_equal(unmask_sum(masked), 3 * np.arange(10))


def test_pair_secret_is_symmetric_and_bound_to_job_and_names() -> None:
    a, b, c = MaskKey.generate(), MaskKey.generate(), MaskKey.generate()

    ab = pair_secret(a, b.public_bytes(), JOB, "a", "b")

    assert len(ab) == 32
    assert ab == pair_secret(b, a.public_bytes(), JOB, "b", "a")
    assert ab != pair_secret(a, b.public_bytes(), "job-8", "a", "b")
    assert ab != pair_secret(a, b.public_bytes(), JOB, "a", "c")
    assert ab != pair_secret(a, c.public_bytes(), JOB, "a", "b")
    assert MaskKey.generate().public_bytes() != a.public_bytes()


@pytest.mark.parametrize("public", [
    bytes(32),  # the neutral point: all-zero shared value
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),  # order 8
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),  # p - 1
])
def test_low_order_public_keys_are_refused(public: bytes) -> None:
    with pytest.raises(MaskError, match="low-order"):
        pair_secret(MaskKey.generate(), public, JOB, "a", "b")


def test_bad_inputs_are_refused() -> None:
    key = MaskKey.generate()
    with pytest.raises(MaskError, match="32 bytes"):
        pair_secret(key, bytes(31), JOB, "a", "b")
    with pytest.raises(MaskError, match="itself"):
        pair_secret(key, key.public_bytes(), JOB, "a", "a")
    with pytest.raises(MaskError, match="int64"):
        mask_vector(np.zeros(3), "a", {}, ROUND)
    with pytest.raises(MaskError, match="own mask peers"):
        mask_vector(np.zeros(3, dtype=np.int64), "a", {"a": bytes(32)}, ROUND)
    with pytest.raises(ProtocolError, match="one length"):
        unmask_sum([np.zeros(3, dtype=np.uint64), np.zeros(4, dtype=np.uint64)])
    with pytest.raises(MaskError, match="no masked"):
        unmask_sum([])


def _histogram_vector(nodes: int = 4) -> np.ndarray:
    """One member's histograms of ``nodes`` nodes on default_credit (23 features x 33 bins x 3)."""
    if not DATA.exists():
        pytest.skip(f"{DATA} is missing")
    raw = np.genfromtxt(DATA, delimiter=",", names=True)
    x = np.column_stack([raw[f"x{j}"] for j in range(23)])
    rng = np.random.default_rng(0)
    p = 1 / (1 + np.exp(-rng.normal(scale=0.5, size=x.shape[0])))
    g, h = quantize(p - raw["y"], x.shape[0]), quantize(p * (1 - p), x.shape[0])
    bins = apply_cuts(x, fit_cuts(x, 32), 32)
    node = rng.integers(0, nodes, size=x.shape[0])
    return build_histograms(bins, node, g.ints, h.ints, nodes, 32).ravel().astype(np.int64)


def _top_byte_p_value(vector: np.ndarray) -> float:
    counts = np.bincount((vector.view(np.uint64) >> np.uint64(56)).astype(np.int64),
                         minlength=256)
    return float(chisquare(counts).pvalue)


def test_a_masked_histogram_looks_uniform_and_the_plain_one_does_not(
        fixed_five: dict[str, dict[str, bytes]]) -> None:
    five = fixed_five
    hist = _histogram_vector()
    assert hist.size == 4 * 23 * 33 * 3

    masked = mask_vector(hist, "carol", five["carol"], ROUND)

    assert _top_byte_p_value(masked) > 0.001
    assert _top_byte_p_value(hist) < 1e-12
    # and one pair's stream alone, seen by the aggregator only summed with others, is uniform
    assert _top_byte_p_value(mask_vector(hist, "alice", {"bob": five["alice"]["bob"]},
                                         ROUND)) > 0.001


def test_masking_throughput(five: dict[str, dict[str, bytes]]) -> None:
    hist = _histogram_vector()
    start = time.perf_counter()
    repeats = 20
    for attempt in range(repeats):
        mask_vector(hist, "carol", five["carol"], MaskRound(JOB, "histograms", 0, 0, attempt))
    seconds = (time.perf_counter() - start) / repeats
    rate = hist.size / seconds
    print(f"\nmasking {hist.size} values with 4 peers: {seconds * 1e3:.2f} ms, "
          f"{rate:.3g} values/s ({rate * 4:.3g} keystream words/s)")
    assert rate > 1e5  # a level's histograms in well under a second


def test_pairs_are_all_distinct(five: dict[str, dict[str, bytes]]) -> None:
    secrets = {frozenset((a, b)): five[a][b] for a, b in combinations(sorted(five), 2)}
    assert len(set(secrets.values())) == 10


# -- seals: a round given up stays shut, whatever arrives later -----------------------------


def _seal_contributions(five: dict[str, dict[str, bytes]]) -> dict[str, bytes]:
    """Every member's contribution as the others open it from its encrypted share."""
    own = {m: bytes([i + 7]) * SEAL_BYTES for i, m in enumerate(sorted(five))}
    opened = {}
    for sender in sorted(five):
        recipient = next(m for m in sorted(five) if m != sender)
        nonce, sealed = seal_share(five[sender][recipient], own[sender], JOB, sender, recipient)
        assert own[sender] not in sealed
        opened[sender] = open_seal_share(five[recipient][sender], nonce, sealed, JOB, sender,
                                         recipient)
    assert opened == own
    return own


def test_a_sealed_round_opens_with_its_key_and_stays_noise_without_it(
        fixed_five: dict[str, dict[str, bytes]]) -> None:
    five = fixed_five
    own = _seal_contributions(five)
    key = round_seal_key(own, ROUND)
    hist = _histogram_vector()
    values = {m: hist if m == "carol" else np.zeros_like(hist) for m in five}
    sealed = [seal_vector(mask_vector(values[m], m, five[m], ROUND), key, m) for m in sorted(five)]
    total = unmask_sum(sealed)  # every vector of the round is in, the pairwise masks cancel
    assert _top_byte_p_value(total) > 0.001  # and still the sum is noise without the key
    opened = unseal_sum(total.view(np.uint64), key, sorted(five)).view(np.int64)
    assert np.array_equal(opened, hist)


def test_the_round_key_needs_every_members_contribution_and_names_the_round(
        five: dict[str, dict[str, bytes]]) -> None:
    own = _seal_contributions(five)
    key = round_seal_key(own, ROUND)
    assert round_seal_key(dict(reversed(list(own.items()))), ROUND) == key  # any order
    fewer = {m: c for m, c in own.items() if m != "erin"}
    assert round_seal_key(fewer, ROUND) != key
    for other in (MaskRound(JOB, "histograms", 3, 1, 1), MaskRound(JOB, "histograms", 4, 1, 0),
                  MaskRound("job-8", "histograms", 3, 1, 0)):
        assert round_seal_key(own, other) != key


def test_a_seal_share_opens_only_for_its_recipient_and_unaltered(
        five: dict[str, dict[str, bytes]]) -> None:
    nonce, sealed = seal_share(five["alice"]["bob"], bytes(SEAL_BYTES), JOB, "alice", "bob")
    with pytest.raises(MaskError, match="does not open"):  # the other direction's key
        open_seal_share(five["alice"]["bob"], nonce, sealed, JOB, "bob", "alice")
    with pytest.raises(MaskError, match="does not open"):
        open_seal_share(five["alice"]["bob"], nonce, sealed[:-1] + bytes([sealed[-1] ^ 1]), JOB,
                        "alice", "bob")
    with pytest.raises(MaskError, match="does not open"):  # another pair
        open_seal_share(five["alice"]["carol"], nonce, sealed, JOB, "alice", "bob")
    with pytest.raises(MaskError, match="nonce"):
        open_seal_share(five["alice"]["bob"], nonce[:4], sealed, JOB, "alice", "bob")
