"""Secure aggregation is real: everything the aggregator of a horizontal job receives, recorded
on the transport, holds each member's histograms only under masks that look uniform, and the
masked vectors of a round still add up to the members' plain histograms exactly."""

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
from tests.scenarios import DATA
from workers.data import load_party_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

MEMBERS = ("guest", "host_1", "host_2")
MAX_BIN = 32
MEMBER_TO_AGGREGATOR = {MsgType.H_SUMMARIES, MsgType.H_MASKED, MsgType.H_GRADIENT_RANGE}
"""All a member may send the aggregator: quantile summaries, masked vectors, peak exponents."""


def _config() -> HorizontalJobConfig:
    parties: dict[str, Any] = {
        m: {"role": "member", "data": str(DATA / f"default_credit_homo_{m}.csv"), "id": "id",
            "label": "y"} for m in MEMBERS}
    parties["aggregator"] = {"role": "aggregator"}
    return HorizontalJobConfig.model_validate({
        "job": "secagg-recorded", "protocol": "horizontal", "parties": parties,
        "params": {"n_trees": 2, "max_depth": 3, "learning_rate": 0.3, "max_bin": MAX_BIN,
                   "objective": "binary"}})


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


def test_aggregator_sees_only_masked_histograms(tmp_path: Path) -> None:
    # Prepare: record every message between the parties of a 2-tree job
    config = _config()
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)

    # Execute
    train_embedded(config, tmp_path, hub=hub)
    recorded = [(s, r, _envelope(d)) for s, r, d in hub.recorded()]

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
    assert np.array_equal(total.view(np.int64), sum(plain[m] for m in MEMBERS))

    # one member's masked values look uniform; its plain histogram does not, and never crossed
    guest = np.concatenate([v for (s, _, _), v in masked.items() if s == "guest"])
    assert _chi_square_p(guest) > 0.001
    assert _chi_square_p(plain["guest"].view(np.uint64)) < 1e-6
    assert np.mean(masked[("guest", 0, 0)] == plain["guest"].view(np.uint64)) < 0.01
    plain_bytes = plain["guest"].astype("<i8").tobytes()
    assert not any(plain_bytes[:64] in _blobs(env.body) for _, env in to_aggregator)


def _blobs(body: Any) -> bytes:
    """Every bytes field of a message body, joined (msgpack of the body's wire form)."""
    from messages.codec import to_wire

    return b"".join(_leaf_bytes(to_wire(body)))


def _leaf_bytes(value: Any) -> list[bytes]:
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _leaf_bytes(v)]
    if isinstance(value, dict):
        return [b for v in value.values() for b in _leaf_bytes(v)]
    return [value] if isinstance(value, bytes) else []
