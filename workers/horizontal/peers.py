"""A member's exchanges with the other members of a horizontal job: its mask public key, the
pair secret with each peer, the peers' seal contributions, and the vectors it masks (and seals)
under them for the aggregator (``workers.pairwise_masks``)."""

from __future__ import annotations

import numpy as np

from boosting._typing import IntArray
from messages.envelope import MsgType
from messages.horizontal import MaskedVector, MaskPublicKey, SealShare
from workers import ProtocolError
from workers.handlers import StepContext
from workers.pairwise_masks import (MaskRound, mask_vector, open_seal_share, pair_secret,
                                        round_seal_key, seal_share, seal_vector)
from workers.horizontal.member_state import MemberJob


def announce_key(ctx: StepContext, job: MemberJob, members: list[str]) -> None:
    """Send the other members this session's mask public key, once: from the first step after
    the flow heard every party open the job (a key sent while opening could reach a member
    that has not opened it yet, which would drop it)."""
    if job.announced:
        return
    for peer in members:
        if peer != ctx.party.name:
            ctx.send(peer, MsgType.H_MASK_KEY, MaskPublicKey(job.mask_key.public_bytes()))
    job.announced = True


def pair_secrets(ctx: StepContext, job: MemberJob, members: list[str]) -> None:
    """The pair secret with every other member of ``members``, once their keys are in; each
    new peer gets this member's seal contribution under it."""
    me = ctx.party.name
    others = [m for m in members if m != me and m not in job.peers]
    ctx.mailbox.require(*[(MsgType.H_MASK_KEY, m, -1, -1) for m in others])
    for peer in others:
        key: MaskPublicKey = ctx.mailbox.take(MsgType.H_MASK_KEY, peer)
        job.peers[peer] = pair_secret(job.mask_key, key.key, ctx.job, me, peer)
        nonce, sealed = seal_share(job.peers[peer], job.seal, ctx.job, me, peer)
        ctx.send(peer, MsgType.H_SEAL_KEY, SealShare(nonce, sealed))


def round_key(ctx: StepContext, job: MemberJob, round_: MaskRound) -> bytes:
    """The seal key of a round of the live members, once their contributions are in."""
    me = ctx.party.name
    others = [m for m in job.live if m != me and m not in job.seals]
    ctx.mailbox.require(*[(MsgType.H_SEAL_KEY, m, -1, -1) for m in others])
    for peer in others:
        share: SealShare = ctx.mailbox.take(MsgType.H_SEAL_KEY, peer)
        job.seals[peer] = open_seal_share(job.peers[peer], share.nonce, share.sealed, ctx.job,
                                          peer, me)
    return round_seal_key({m: job.seal if m == me else job.seals[m] for m in job.live}, round_)


def send_masked(ctx: StepContext, job: MemberJob, values: IntArray, purpose: str, tree: int,
                depth: int, attempt: int, live: list[str], sealed: bool = False) -> None:
    """Mask ``values`` for the round's live members (and seal them) and send them to the
    aggregator."""
    me = ctx.party.name
    key = (purpose, tree, depth, attempt)
    if key in job.masked:  # a second vector under the same masks would reveal the difference
        raise ProtocolError(f"{me}: already masked a vector for {purpose} tree {tree} depth "
                            f"{depth} attempt {attempt}: refused")
    round_ = MaskRound(ctx.job, purpose, tree, depth, attempt)
    seal_key = round_key(ctx, job, round_) if sealed else b""  # may wait: nothing sent yet
    job.masked.add(key)
    masked = mask_vector(values.astype(np.int64).ravel(), me,
                         {m: job.peers[m] for m in live if m != me}, round_)
    if sealed:
        masked = seal_vector(masked, seal_key, me)
    ctx.send(job.aggregator, MsgType.H_MASKED,
             MaskedVector(purpose, tree, depth, attempt, masked.astype("<u8").tobytes()))
