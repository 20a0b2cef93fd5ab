"""SimFL's aggregator (seed 000, Algorithm 1): builds the global hash tables from the members'
LSH values and tells each member, for each of its rows, the most similar row of every other
member (by handle), and every other member's handles. It never sees a feature value, nor the
hash functions (a secret of the members); after preprocessing it has nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from boosting.losses import base_score_of_mean
from messages.bodies import Ack, Opened, Step
from messages.envelope import MsgType
from messages.simfl import OpenSimfl, RowHashes, SimilarRows, SimflSpec
from workers import ProtocolError
from workers.handlers import StepContext
from workers.policy import check_protocol
from workers.row_partitioned import aggregator_of, members_of
from workers.simfl.lsh import most_similar
from workers.horizontal.member import MAX_CLASSES
from workers.simfl.member import MAX_ROWS, PROTOCOL

MAX_FUNCTIONS = 1000


@dataclass(slots=True)
class SimflAggregator:
    spec: SimflSpec


def open_job(ctx: StepContext, body: OpenSimfl) -> tuple[MsgType, Any]:
    me = ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    if aggregator_of(body.spec) != me:
        raise ProtocolError(f"{me}: the job's aggregator is {aggregator_of(body.spec)}")
    if len(members_of(body.spec)) < 2:
        raise ProtocolError(f"{me}: SimFL needs at least 2 members")
    ctx.state = SimflAggregator(body.spec)
    return MsgType.OPENED, Opened(rows=0, checkpoints=[])


def match_rows(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Global hash tables: for every member's row and every other member, that member's row
    with the most identical hash values (ties at random), sent to each member by handle."""
    job: SimflAggregator = ctx.state
    members = members_of(job.spec)
    ctx.mailbox.require(*[(MsgType.S_ROW_HASHES, m, -1, -1) for m in members])
    received: list[RowHashes] = [ctx.mailbox.take(MsgType.S_ROW_HASHES, m) for m in members]
    reference = received[0].columns
    if any(r.columns != reference for r in received):
        for m in members:  # each member then names its own file and its difference
            ctx.send(m, MsgType.S_SIMILAR, SimilarRows(list(reference), [], [], 0.0, [], 0))
        return MsgType.ACK, Ack(count=0)
    handles, hashes = {}, {}
    for m, r in zip(members, received):
        n = len(r.handles) // 8
        if not (0 < n <= MAX_ROWS and len(r.handles) == 8 * n
                and 0 < r.functions <= MAX_FUNCTIONS and r.functions == received[0].functions
                and len(r.hashes) == 4 * n * r.functions and 0 <= r.label_sum <= n
                and _fits(job.spec.params.objective, r.classes)):
            raise ProtocolError(f"{ctx.party.name}: {m}'s hash values are malformed")
        handles[m] = np.frombuffer(r.handles, "<u8")
        hashes[m] = np.frombuffer(r.hashes, "<i4").reshape(n, r.functions)
    rows = sum(h.size for h in handles.values())
    classes = max(r.classes for r in received)
    base = 0.0 if job.spec.params.objective == "multiclass" else \
        float(base_score_of_mean(job.spec.params.objective, sum(r.label_sum for r in received) / rows)[0])
    rng = np.random.default_rng([job.spec.params.seed, job.spec.lsh_seed])  # the paper's random ties
    for m in members:
        others = [o for o in members if o != m]
        similar = [handles[o][most_similar(hashes[m], hashes[o], rng)] for o in others]
        ctx.send(m, MsgType.S_SIMILAR, SimilarRows(
            list(reference), others, [s.astype("<u8").tobytes() for s in similar], base,
            [received[members.index(o)].handles for o in others], classes))
    return MsgType.ACK, Ack(count=len(members))


def _fits(objective: str, classes: int) -> bool:
    """A member's classes: 2..MAX_CLASSES in multiclass (each holds two at least), else 1."""
    return 2 <= classes <= MAX_CLASSES if objective == "multiclass" else classes == 1


def close_job(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    return MsgType.ACK, Ack()
