"""A SimFL member's refusals, against a flow, an aggregator and another member played by the
test (docs/threat-model.md, SimFL).

One real member worker (``a``, breast_homo_guest.csv, the first member: it chooses the hash
functions' secret) with real signing keys. A job asking for less noise than the member's
minimum, a checkpoint of the format that sent exact sums, and gradient sums that do not cover
the builder's rows are refused in one line, and the worker goes on; the secret reaches the
other member sealed, and what the member sends as a contributor is a noisy value for every row
of the builder.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from messages.bodies import Checkpoint, ErrorReply, PartyInfo, ResumeJob, Step
from messages.e2e import decrypt_body
from messages.envelope import Envelope, Kind, MsgType
from messages.signing import federation_sealers
from messages.simfl import LshKey, OpenSimfl, Prepare, SimflSpec, SimilarGradients, SimilarRows
from messages.transport import MemoryHub
from messages.params import TreeParams
from workers import checkpoint
from workers.pairwise_masks import MaskKey, pair_secret
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker
from workers.simfl.privacy import GRID

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "breast_homo_guest.csv"
SEALERS = federation_sealers(["a", "b", "agg"])
SPEC = SimflSpec([PartyInfo("a", "member"), PartyInfo("b", "member"),
                  PartyInfo("agg", "aggregator")],
                  TreeParams(n_trees=2, max_depth=3), 0, 4.0, 7, 4.0, 8.0, 1.0)
KEY = "ab" * 32


class Federation:
    """Member ``a`` in a real worker; the flow, the aggregator and ``b`` played by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.hub = MemoryHub(["a", "b", "agg", "flow"])
        self.party = PartySpec("a", "", str(DATA), "id", "y", str(tmp_path / "a"),
                               policy=PartyPolicy(protocols=("simfl",)))
        self.worker = Worker(self.party, self.hub.endpoint("a"), PROTOCOLS, SEALERS["a"])
        self.steps = 0

    def command(self, kind: Kind, body: Any) -> Any:
        self.steps += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(
            Envelope("job", f"s/{self.steps}", "flow", "a", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=5)
        assert data is not None, f"no reply to {kind.name}"
        return SEALERS["flow"].open(data).body

    def peer(self, sender: str, kind: Kind, body: Any) -> None:
        self.worker.handle_bytes(SEALERS[sender].seal(Envelope("job", "s/peer", sender, "a",
                                                               kind, body)))

    def received(self, who: str) -> list[Envelope]:
        out = []
        while (data := self.hub.endpoint(who).receive(timeout=0.2)) is not None:
            out.append(SEALERS[who].open(data))
        return out


def test_a_job_with_less_noise_than_the_minimum_is_refused(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    reply = fed.command(MsgType.S_OPEN_JOB, OpenSimfl(replace(SPEC, noise_label=0.01)))
    assert isinstance(reply, ErrorReply) and "below this member's minimum 1.0: refused" in \
        reply.message and "\n" not in reply.message
    assert fed.command(MsgType.S_OPEN_JOB, OpenSimfl(SPEC)).rows > 0  # and it goes on


def test_a_checkpoint_of_exact_sums_is_refused_by_name(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    opened = fed.command(MsgType.S_OPEN_JOB, OpenSimfl(SPEC))
    assert opened.checkpoints == []
    digest = checkpoint.job_digest(SPEC, str(DATA), None)
    old = {"handles": np.zeros(3, np.uint64), "similar": [], "members": [], "base": 0.0,
           "margin": np.zeros((3, 1)), "trees": [], "history": []}  # format 1: no "format"
    checkpoint.save(fed.party.model_folder("job"), 0, digest, KEY, old,
                    checkpoint.key_of(fed.party))
    assert fed.command(MsgType.S_OPEN_JOB, OpenSimfl(SPEC)).checkpoints == [Checkpoint(0, KEY)]
    reply = fed.command(MsgType.RESUME_JOB, ResumeJob(Checkpoint(0, KEY)))
    assert isinstance(reply, ErrorReply) and "format 1 (exact gradient sums)" in reply.message


@pytest.fixture()
def prepared(tmp_path: Path) -> tuple[Federation, bytes, int]:
    """Member ``a`` preprocessed against ``b`` (4 rows) by way of the test; the secret ``b``
    opened, and ``a``'s row count."""
    fed = Federation(tmp_path)
    rows = fed.command(MsgType.S_OPEN_JOB, OpenSimfl(SPEC)).rows
    fed.command(MsgType.S_MEMBER_KEY, Step())
    assert fed.command(MsgType.S_HASH_ROWS, Prepare(KEY, False)).count == 0  # not on record
    b_key = MaskKey.generate()
    fed.peer("b", MsgType.S_LSH_KEY, LshKey(b_key.public_bytes()))
    assert fed.command(MsgType.S_HASH_ROWS, Prepare(KEY, True)).count > 0
    sealed = next(e.body for e in fed.received("b") if e.kind == MsgType.S_LSH_SECRET)
    secret = decrypt_body(pair_secret(b_key, sealed.public, "job", "b", "a"), sealed.sealed,
                          _bound("a", "b"))
    hashes = next(e.body for e in fed.received("agg") if e.kind == MsgType.S_ROW_HASHES)
    b_handles = np.arange(1, 5, dtype="<u8")
    fed.peer("agg", MsgType.S_SIMILAR, SimilarRows(
        hashes.columns, ["b"], [np.resize(b_handles, rows).tobytes()], -0.5,
        [b_handles.tobytes()], 1))
    fed.command(MsgType.S_STORE_SIMILAR, Step())
    return fed, secret, rows


def _bound(sender: str, recipient: str) -> bytes:
    """What the first member binds the sealed secret to (``workers.simfl.preprocess``)."""
    return msgpack.packb(["simfl lsh secret v1", "job", sender, recipient], use_bin_type=True)


def test_the_secret_reaches_b_sealed_and_sums_must_cover_the_builders_rows(
        prepared: tuple[Federation, bytes, int]) -> None:
    fed, secret, rows = prepared
    assert len(secret) == 32  # b opened it with its own key of this job
    fed.peer("b", MsgType.S_GRADIENTS, SimilarGradients(0, bytes(8 * (rows - 1)), 1.0))
    reply = fed.command(MsgType.S_BUILD_TREE, Step(0, -1, ["a"]))
    assert isinstance(reply, ErrorReply) and f"b sent {rows - 1} gradient sums for {rows} rows" \
        in reply.message
    fed.peer("b", MsgType.S_GRADIENTS, SimilarGradients(0, bytes(8 * rows), float("nan")))
    reply = fed.command(MsgType.S_BUILD_TREE, Step(0, -1, ["a"]))
    assert isinstance(reply, ErrorReply) and "b's gradient sums are not finite" in reply.message
    fed.peer("b", MsgType.S_GRADIENTS, SimilarGradients(0, bytes(8 * rows), 1.0))
    assert not isinstance(fed.command(MsgType.S_BUILD_TREE, Step(0, -1, ["a"])), ErrorReply)
    assert [e.kind for e in fed.received("b")] == [MsgType.S_TREE]
    # tree 1 is b's: a sends a noisy g for each of b's 4 rows and one noisy h total, on the
    # noise's grid
    assert fed.command(MsgType.S_SEND_GRADIENTS, Step(1, -1, ["b"])).count == 4
    sent: SimilarGradients = fed.received("b")[0].body
    g = np.frombuffer(sent.g, "<f8")
    assert g.size == 4 and (g != 0).all() and isinstance(sent.h_total, float)
    assert np.array_equal(g / GRID, np.round(g / GRID))
