"""Secure aggregation is real: everything the aggregator of a horizontal job receives, recorded
on the transport, holds each member's histograms only under masks that look uniform, and the
masked vectors of a round still add up to the members' plain histograms exactly (a root round
once a member released its key). And no member's raw value reaches another party (issue 23,
item 2): the quantile summaries carried every value of a column (all of them once a member had
fewer rows than ``summary_size``) and most inner cuts were values found only in another
member's rows; now the cuts come from summed cell counts on a public grid."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from boosting.binning import apply_cuts
from boosting.fixedpoint import quantize
from boosting.hist import build_histograms
from boosting.losses import gradients
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from fedboost.joined import pool_members
from flows.config import HorizontalJobConfig
from messages.envelope import Envelope, MsgType, decode_envelope
from messages.transport import MemoryHub
from tests.privacy import harness
from tests.scenarios import DATA
from workers.data import load_party_data
from workers.pairwise_masks import unseal_sum

pytestmark = pytest.mark.usefixtures("prefect_harness")

MEMBERS = ("guest", "host_1", "host_2")
MAX_BIN = 32
MIN_LEAF = 50
MEMBER_TO_AGGREGATOR = {MsgType.H_COLUMNS, MsgType.H_MASKED, MsgType.H_GRADIENT_RANGE,
                        MsgType.H_ROUND_KEY}
"""All a member may send the aggregator: column names, masked vectors, peak exponents, root
round keys."""


def _config() -> HorizontalJobConfig:
    parties: dict[str, Any] = {
        m: {"role": "member", "data": str(DATA / f"default_credit_homo_{m}.csv"), "id": "id",
            "label": "y"} for m in MEMBERS}
    parties["aggregator"] = {"role": "aggregator"}
    return HorizontalJobConfig.model_validate({
        "job": "secagg-recorded", "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": 2, "max_depth": 3, "learning_rate": 0.3, "max_bin": MAX_BIN,
                   "objective": "binary", "min_samples_leaf": MIN_LEAF}})


def _envelope(sealed: bytes) -> Envelope:
    """The envelope inside a signed message (the recorder sees what crossed the wire)."""
    return decode_envelope(msgpack.unpackb(sealed)["envelope"])


def _chi_square_p(values: np.ndarray) -> float:
    """p-value of Pearson's chi-square test of the top 8 bits of uint64 values against the
    uniform distribution over 256 buckets (scipy's chi-square tail if installed, else the
    Wilson-Hilferty approximation, within 1e-3 of it at 255 degrees of freedom)."""
    counts = np.bincount((values >> np.uint64(56)).astype(np.int64), minlength=256)
    expected = values.size / 256
    statistic, df = float(((counts - expected) ** 2 / expected).sum()), 255
    try:
        from scipy.stats import chi2
    except ImportError:
        z = ((statistic / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
        return 0.5 * math.erfc(z / math.sqrt(2))
    return float(chi2.sf(statistic, df))


def _plain_root_histograms(config: HorizontalJobConfig, cuts: list[np.ndarray],
                           base: float) -> dict[str, np.ndarray]:
    """Each member's histogram of tree 0's root, recomputed from its file: its rows binned with
    the shared cuts, the gradients at the base score quantized over all members' rows."""
    data = {m: load_party_data(m, str(config.parties[m].data), "id", "y", require_label=True)
            for m in MEMBERS}
    y = np.concatenate([data[m].y for m in MEMBERS])  # type: ignore[misc]
    g, h = (a[:, 0] for a in gradients("binary", np.full((y.size, 1), base), y))
    g_ints, h_ints = quantize(g, y.size).ints, quantize(h, y.size).ints
    hists, start = {}, 0
    for m in MEMBERS:
        rows = slice(start, start + len(data[m].ids))
        bins = apply_cuts(data[m].x, cuts, MAX_BIN)
        hists[m] = build_histograms(bins, np.zeros(bins.shape[0], dtype=np.int64),
                                    g_ints[rows], h_ints[rows], 1, MAX_BIN).ravel()
        start = rows.stop
    return hists


Recorded = list[tuple[str, str, Envelope]]


@pytest.fixture(scope="module")
def recorded(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """Every message between the parties of a 2-tree job."""
    config = _config()
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    train_embedded(config, tmp_path_factory.mktemp("secagg"), hub=hub)
    return [(s, r, _envelope(d)) for s, r, d in hub.recorded()]


def test_aggregator_sees_only_masked_histograms(recorded: Recorded) -> None:
    config = _config()

    # Assert: members send the aggregator summaries, exponents and masked vectors, nothing else
    to_aggregator = [(s, env) for s, r, env in recorded if r == "aggregator" and s in MEMBERS]
    assert {env.kind for _, env in to_aggregator} == MEMBER_TO_AGGREGATOR
    masked = {(s, env.body.tree, env.body.depth): np.frombuffer(env.body.values, dtype="<u8")
              for s, env in to_aggregator
              if env.kind == MsgType.H_MASKED and env.body.purpose == "hist"}
    assert {(t, d) for _, t, d in masked} == {(t, d) for t in range(2) for d in range(3)}
    assert {s for s, _, _ in masked} == set(MEMBERS)

    # the shared cuts and base score every member was sent, which the reference cuts match
    shared = next(env.body for s, r, env in recorded if env.kind == MsgType.H_CUTS)
    cuts = [np.frombuffer(c, dtype="<f8") for c in shared.cuts]
    assert all(np.array_equal(a, b) for a, b in zip(cuts, pool_members(config).cuts, strict=True))
    plain = _plain_root_histograms(config, cuts, shared.base_score)

    # the masks cancel only in the sum over the members: it is the plain sum, exactly
    roots = [masked[(m, 0, 0)] for m in MEMBERS]
    total = np.zeros(roots[0].size, dtype=np.uint64)
    for vector in roots:
        total += vector
    expected = sum(plain[m] for m in MEMBERS)
    assert not np.array_equal(total.view(np.int64), expected)  # the root is also sealed
    keys = {env.body.key for _, env in to_aggregator
            if env.kind == MsgType.H_ROUND_KEY and env.body.tree == 0}
    assert len(keys) == 1  # every member released the same key of tree 0's root
    opened = unseal_sum(total, keys.pop(), list(MEMBERS))
    assert np.array_equal(opened.view(np.int64), expected)

    # one member's masked values look uniform; its plain histogram does not, and never crossed
    guest = np.concatenate([v for (s, _, _), v in masked.items() if s == "guest"])
    assert _chi_square_p(guest) > 0.001
    assert _chi_square_p(plain["guest"].view(np.uint64)) < 1e-6
    assert np.mean(masked[("guest", 0, 0)] == plain["guest"].view(np.uint64)) < 0.01
    plain_bytes = plain["guest"].astype("<i8").tobytes()
    assert not any(plain_bytes[:64] in harness.blobs(env.body) for _, env in to_aggregator)


def test_no_members_raw_value_reaches_another_party(recorded: Recorded) -> None:
    config = _config()
    raw = {}
    for m in MEMBERS:
        x = load_party_data(m, str(config.parties[m].data), "id", "y", require_label=True).x
        raw[m] = {float(v) for v in x[~np.isnan(x)]}
    received: dict[str, set[float]] = {}
    for sender, recipient, env in recorded:
        if sender != recipient:
            received.setdefault(recipient, set()).update(harness.numbers(env.body))
    assert set(received) == {*MEMBERS, "aggregator", FLOW_ENDPOINT}

    # no party received a raw value of a member that it does not hold itself, but for the
    # odd value that happens to be a point of the public grid (which says nothing of it)
    for party, numbers in received.items():
        for m in MEMBERS:
            leaked = (raw[m] - raw.get(party, set())) & numbers
            assert all(_grid_point(v) for v in leaked), f"{party} received {m}'s values"

    # the measure: inner cuts that are raw values found only in another member's rows
    shared = next(env.body for _, _, env in recorded if env.kind == MsgType.H_CUTS)
    inner = [c for cuts in shared.cuts for c in np.frombuffer(cuts, dtype="<f8")[:-1]]
    assert len(inner) > 400 and all(_grid_point(c) for c in inner)
    for m in MEMBERS:
        only_others = set().union(*(raw[o] for o in MEMBERS if o != m)) - raw[m]
        found = [c for c in inner if c in only_others]
        # a few coarse grid points are also values of one member (-0.5, 5/64 = 0.078125)
        assert len(found) <= 3 and all(_grid_point(c) for c in found), (m, found)


def _grid_point(value: float) -> bool:
    """A point of the set-up grid: a power of two split ``MAX_ROUNDS - 1`` times into 16
    (``workers.horizontal.grid``), i.e. at most 9 significant bits."""
    mantissa = math.frexp(value)[0]
    return mantissa * 2**9 == round(mantissa * 2**9)


def test_every_sum_the_aggregator_opens_is_over_at_least_min_samples_leaf_rows(
        recorded: Recorded) -> None:
    """What an honest aggregator sees beyond the model: the union's histogram of every node it
    builds; a node of few rows would show their bins and gradients. ``min_samples_leaf`` bounds
    the rows behind each (docs/threat-model.md)."""
    rounds: dict[tuple[int, int], list[np.ndarray]] = {}
    for _, recipient, env in recorded:
        if recipient == "aggregator" and env.kind == MsgType.H_MASKED and \
                env.body.purpose == "hist":
            rounds.setdefault((env.body.tree, env.body.depth), []).append(
                np.frombuffer(env.body.values, dtype="<u8").astype(np.uint64))
    keys = {env.body.tree: env.body.key for _, _, env in recorded
            if env.kind == MsgType.H_ROUND_KEY}
    sizes = []
    for (tree, depth), vectors in rounds.items():
        assert len(vectors) == len(MEMBERS)
        total = np.zeros(vectors[0].size, dtype=np.uint64)
        for vector in vectors:
            total += vector
        if depth == 0:
            total = unseal_sum(total, keys[tree], list(MEMBERS))
        nodes = total.view(np.int64).reshape(-1, 23, MAX_BIN + 1, 3)
        sizes += nodes[:, 0, :, 2].sum(axis=1).tolist()
    assert len(sizes) >= 8 and min(sizes) >= MIN_LEAF, sorted(sizes)[:5]


def test_every_class_tree_of_a_multiclass_job_is_masked_and_sealed_on_its_own(
        tmp_path: Path) -> None:
    """Multiclass (vehicle split by rows, 4 classes, 2 rounds): the aggregator gets every
    class's histograms masked, each tree's root under a round key of its own, which opens the
    sum of that class's plain root histograms exactly and no other tree's; the masked set-up
    stats sum to the union's rows per class, which no member's vector shows."""
    from benchmarks.vehicle_data import prepare

    files = prepare(tmp_path / "data", parties=2, seed=0)
    members = ["A", "B"]
    config = HorizontalJobConfig.model_validate({
        "job": "secagg-multiclass", "protocol": "horizontal",
        "parties": {**{m: {"role": "member", "data": str(files[m]), "id": "id", "label": "y"}
                       for m in members}, "aggregator": {"role": "aggregator"}},
        "params": {"n_trees": 2, "max_depth": 2, "max_bin": MAX_BIN, "objective": "multiclass"}})
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    train_embedded(config, tmp_path / "run", hub=hub)
    sent = [(s, _envelope(d)) for s, r, d in hub.recorded() if r == "aggregator"]
    masked = {(s, env.body.purpose, env.body.tree, env.body.depth):
              np.frombuffer(env.body.values, dtype="<u8").astype(np.uint64)
              for s, env in sent if env.kind == MsgType.H_MASKED}
    assert {(t, d) for s, p, t, d in masked if p == "hist"} == \
        {(t, d) for t in range(8) for d in range(2)}
    keys = {env.body.tree: env.body.key for _, env in sent if env.kind == MsgType.H_ROUND_KEY}
    assert sorted(keys) == list(range(8)) and len(set(keys.values())) == 8

    data = {m: load_party_data(m, str(files[m]), "id", "y", require_label=True) for m in members}
    y = np.concatenate([data[m].y for m in members])  # type: ignore[misc]
    stats = masked[("A", "stats", -1, -1)] + masked[("B", "stats", -1, -1)]
    assert np.array_equal(stats.view(np.int64)[:5], [y.size, *np.bincount(y.astype(int))])
    assert not np.array_equal(masked[("A", "stats", -1, -1)].view(np.int64)[1:5],
                              np.bincount(data["A"].y.astype(int)))  # type: ignore[union-attr]
    shared = next(env.body for s, r, d in hub.recorded() for env in [_envelope(d)]
                  if env.kind == MsgType.H_CUTS)
    assert shared.classes == 4 and shared.base_score == 0.0
    cuts = [np.frombuffer(c, dtype="<f8") for c in shared.cuts]
    g, h = gradients("multiclass", np.zeros((y.size, 4)), y)  # round 0: every margin is 0
    bins = np.vstack([apply_cuts(data[m].x, cuts, MAX_BIN) for m in members])
    for k in range(4):  # tree k of round 0 grows class k
        plain = build_histograms(bins, np.zeros(y.size, dtype=np.int64),
                                 quantize(g[:, k], y.size).ints, quantize(h[:, k], y.size).ints,
                                 1, MAX_BIN).ravel()
        total = masked[("A", "hist", k, 0)] + masked[("B", "hist", k, 0)]
        assert not np.array_equal(total.view(np.int64), plain)  # sealed
        assert np.array_equal(unseal_sum(total, keys[k], members).view(np.int64), plain)
        other = unseal_sum(total, keys[(k + 1) % 4], members).view(np.int64)
        assert not np.array_equal(other, plain)  # another class's key opens nothing
    guest = np.concatenate([v for (s, p, _, _), v in masked.items() if s == "A" and p == "hist"])
    assert _chi_square_p(guest) > 0.001
