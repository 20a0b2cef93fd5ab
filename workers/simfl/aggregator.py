"""SimFL's aggregator (seed 000, Algorithm 1): builds the global hash tables from the members'
keyed LSH bucket ids (``workers.simfl.lsh.bucket_ids``: equal values, equal ids, nothing else)
and tells each member, for each of its rows, the most similar row of every other
member (by handle), and every other member's handles. It never sees a feature value, nor the
hash functions (a secret of the members); after preprocessing it has nothing to do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from boosting.losses import base_score_of_mean
from messages.bodies import Ack, Opened, Step
from messages.envelope import Kind, MsgType
from messages.simfl import OpenSimfl, RowHashes, SimilarRows, SimflSpec
from workers import ProtocolError, checkpoint
from workers.handlers import StepContext
from workers.policy import check_protocol
from workers.row_partitioned import MAX_CLASSES, aggregator_of, members_of
from workers.simfl.lsh import most_similar
from workers.simfl.member import MAX_ROWS, PROTOCOL
from workers.simfl.privacy import derive_key, uniform

MAX_FUNCTIONS = 1000


@dataclass(slots=True)
class SimflAggregator:
    spec: SimflSpec


def open_job(ctx: StepContext, body: OpenSimfl) -> tuple[Kind, Any]:
    me = ctx.party.name
    check_protocol(ctx.party.policy, me, PROTOCOL)
    if aggregator_of(body.spec) != me:
        raise ProtocolError(f"{me}: the job's aggregator is {aggregator_of(body.spec)}")
    if len(members_of(body.spec)) < 2:
        raise ProtocolError(f"{me}: SimFL needs at least 2 members")
    ctx.state = SimflAggregator(body.spec)
    return MsgType.OPENED, Opened(rows=0, checkpoints=[])


def match_rows(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Global hash tables: for every member's row and every other member, that member's row
    with the most identical bucket ids (ties at random, from this party's own key), sent to
    each member by handle."""
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
                and len(r.hashes) == 8 * n * r.functions and 0 <= r.label_sum <= n
                and _fits(job.spec.params.objective, r.classes)):
            raise ProtocolError(f"{ctx.party.name}: {m}'s hash values are malformed")
        handles[m] = np.frombuffer(r.handles, "<u8")
        hashes[m] = np.frombuffer(r.hashes, "<u8").reshape(n, r.functions)
    rows = sum(h.size for h in handles.values())
    classes = max(r.classes for r in received)
    base = 0.0 if job.spec.params.objective == "multiclass" else \
        float(base_score_of_mean(job.spec.params.objective, sum(r.label_sum for r in received) / rows)[0])
    ties = _tie_key(ctx, members, hashes)
    for m in members:
        others = [o for o in members if o != m]
        picks = [uniform(derive_key(ties, "pair", m, o), hashes[m].shape[0]) for o in others]
        similar = [handles[o][most_similar(hashes[m], hashes[o], p)]
                   for o, p in zip(others, picks)]
        ctx.send(m, MsgType.S_SIMILAR, SimilarRows(
            list(reference), others, [s.astype("<u8").tobytes() for s in similar], base,
            [received[members.index(o)].handles for o in others], classes))
    return MsgType.ACK, Ack(count=len(members))


def _tie_key(ctx: StepContext, members: list[str], buckets: dict[str, np.ndarray]) -> bytes:
    """The key of the paper's random ties: the aggregator's own (a member sees which of the
    tied rows was chosen, in that member's order, so a draw from the job's seeds would tell it
    how many rows tie), keyed by the bucket ids: preprocessing the same rows again draws the
    same ties (fresh handles do not change them), so repeating it shows nothing new."""
    digest = hashlib.sha256()
    for m in members:
        digest.update(m.encode() + b"\0" + buckets[m].astype("<u8").tobytes())
    return derive_key(checkpoint.key_of(ctx.party), "simfl ties v1", digest.digest())


def _fits(objective: str, classes: int) -> bool:
    """A member's classes: 2..MAX_CLASSES in multiclass (each holds two at least), else 1."""
    return 2 <= classes <= MAX_CLASSES if objective == "multiclass" else classes == 1


def close_job(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    return MsgType.ACK, Ack()
