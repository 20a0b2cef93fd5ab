"""Entity alignment by DH-PSI (SecureBoost section 3; seed 002 section 4.1), both roles.

1. psi_blind: every party hashes its ids to the group and blinds them with its secret; a
   passive party sends its (shuffled) blinded ids to the active party, the active party sends
   its blinded ids to every passive party.
2. psi_reblind: a passive party re-blinds the active party's points and returns them in order.
3. psi_intersect: the active party re-blinds each passive party's points, matches the doubly
   blinded sets, fixes the common row order (ids sorted) and the validation hold-out, and tells
   each passive party the aligned position of each id it sent (or -1).
Each party learns only which of its own ids are in the intersection, and the others' set sizes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from crypto.schemes import PublicKey
from crypto.psi import POINT_BYTES, split_points
from messages.bodies import Ack, Aligned, AlignedRows, PsiPoints, Step
from messages.secureboost import PublicKeyMsg
from messages.envelope import Kind, MsgType
from messages.instance_space import decode_mask, encode_mask
from workers import DataError, ProtocolError
from workers.handlers import StepContext
from workers.lifeline import die_with_parent
from workers.state import JobState

STAGE_PASSIVE_IDS = 1
STAGE_ACTIVE_IDS = 2
STAGE_ACTIVE_REBLINDED = 3

log = logging.getLogger("fedboost.worker")
PROGRESS_SECONDS = 10.0
"""How often a long blinding logs how far it is (a million ids take minutes)."""


class _Progress:
    """Logs ``done/total`` points and the rate, at most every ``PROGRESS_SECONDS``."""

    def __init__(self, party: str, what: str) -> None:
        self.party, self.what = party, what
        self.started = self.logged = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.logged >= PROGRESS_SECONDS or (done == total and now - self.started
                                                      >= PROGRESS_SECONDS):
            self.logged = now
            log.info("%s: %s %d/%d points (%.0f/s)", self.party, self.what, done, total,
                     done / max(now - self.started, 1e-9))


def holdout_mask(n_rows: int, fraction: float, seed: int) -> np.ndarray:
    """Seeded validation hold-out over aligned positions (the same rows the centralized run uses)."""
    mask = np.zeros(n_rows, dtype=bool)
    n_valid = int(round(n_rows * fraction))
    if n_valid:
        mask[np.random.default_rng(seed).permutation(n_rows)[:n_valid]] = True
    return mask


def psi_blind(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Step 1: blind own ids; send them to the other side."""
    state: JobState = ctx.state
    order = np.random.default_rng().permutation(len(state.data.ids))
    state.psi_order = order
    ids = state.data.ids
    blob = state.psi_key().hash_and_blind([ids[i] for i in order.tolist()],
                                          progress=_Progress(state.party, "psi_blind"),
                                          on_start=die_with_parent)
    if state.party == state.active:
        for passive in state.passives:
            ctx.send(passive, MsgType.PSI_POINTS, PsiPoints(STAGE_ACTIVE_IDS, blob))
    else:
        ctx.send(state.active, MsgType.PSI_POINTS, PsiPoints(STAGE_PASSIVE_IDS, blob))
    return MsgType.ACK, Ack(count=len(blob) // POINT_BYTES)


def psi_reblind(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Step 2 (passive): re-blind the active party's points, keeping their order."""
    state: JobState = ctx.state
    received: PsiPoints = ctx.mailbox.take(MsgType.PSI_POINTS, state.active, -1, STAGE_ACTIVE_IDS)
    again = state.psi_key().blind_batched(received.points,
                                          progress=_Progress(state.party, "psi_reblind"),
                                          on_start=die_with_parent)
    ctx.send(state.active, MsgType.PSI_POINTS, PsiPoints(STAGE_ACTIVE_REBLINDED, again))
    return MsgType.ACK, Ack(count=len(again) // POINT_BYTES)


def psi_intersect(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Step 3 (active): match, order, hold out, and tell each passive party its rows."""
    state: JobState = ctx.state
    if state.psi_order is None:
        raise ProtocolError("psi_intersect before psi_blind")
    keys = [(MsgType.PSI_POINTS, p, -1, s) for p in state.passives
            for s in (STAGE_PASSIVE_IDS, STAGE_ACTIVE_REBLINDED)]
    ctx.mailbox.require(*keys)
    n_own = len(state.data.ids)
    present = np.ones(n_own, dtype=bool)
    matches: dict[str, np.ndarray] = {}
    for passive in state.passives:
        theirs = ctx.mailbox.take(MsgType.PSI_POINTS, passive, -1, STAGE_PASSIVE_IDS).points
        ours = split_points(ctx.mailbox.take(MsgType.PSI_POINTS, passive, -1, STAGE_ACTIVE_REBLINDED).points)
        if len(ours) != n_own:
            raise ProtocolError(f"{passive} returned {len(ours)} re-blinded ids, expected {n_own}")
        row_of = dict(zip(ours, state.psi_order.tolist()))
        del ours
        again = state.psi_key().blind_batched(theirs, progress=_Progress(state.party,
                                                                         "psi_intersect"),
                                              on_start=die_with_parent)
        matched = np.fromiter((row_of.get(again[a:a + POINT_BYTES], -1)
                               for a in range(0, len(again), POINT_BYTES)),
                              dtype=np.int64, count=len(again) // POINT_BYTES)
        del row_of
        seen = np.zeros(n_own, dtype=bool)
        seen[matched[matched >= 0]] = True
        present &= seen
        matches[passive] = matched
    rows = np.flatnonzero(present)
    if rows.size == 0:
        raise DataError(f"party {state.party}: empty intersection of ids with "
                        f"{', '.join(state.passives)}; check the id columns hold the same keys, "
                        f"spelled the same way ('17', '17.0' and '0017' are different ids)")
    aligned = rows[np.argsort(np.array([state.data.ids[r] for r in rows]), kind="stable")]
    position = np.full(n_own, -1, dtype=np.int64)
    position[aligned] = np.arange(aligned.size)
    valid = holdout_mask(aligned.size, state.valid_fraction, state.valid_seed)
    state.aligned, state.valid = aligned, valid
    for passive, matched in matches.items():
        their_positions = np.where(matched >= 0, position[np.maximum(matched, 0)], -1).astype("<i4")
        ctx.send(passive, MsgType.ALIGNED_ROWS,
                 AlignedRows(positions=their_positions.tobytes(), valid=encode_mask(valid)))
    return MsgType.ALIGNED, Aligned(n_aligned=int(aligned.size), n_train=int((~valid).sum()),
                                    n_valid=int(valid.sum()))


def send_public_key(ctx: StepContext, state: JobState, public: PublicKey) -> None:
    """Give every passive party the public key (its modulus: the job names the scheme)."""
    msg = PublicKeyMsg(n=public.n_bytes, bits=int(public.n).bit_length())
    for passive in state.passives:
        ctx.send(passive, MsgType.PUBLIC_KEY, msg)


def receive_alignment(ctx: StepContext) -> None:
    """Passive: take the active party's alignment answer (once) and derive the row order."""
    state: JobState = ctx.state
    if state.aligned is not None:
        return
    if state.psi_order is None:
        raise ProtocolError("alignment received before psi_blind")
    answer: AlignedRows = ctx.mailbox.take(MsgType.ALIGNED_ROWS, state.active)
    positions = np.frombuffer(answer.positions, dtype="<i4").astype(np.int64)
    if positions.size != state.psi_order.size:
        raise ProtocolError(f"alignment covers {positions.size} ids, this party sent "
                            f"{state.psi_order.size}")
    inside = positions >= 0
    n_aligned = int(inside.sum())
    if n_aligned == 0:
        raise DataError(f"party {state.party}: empty intersection of ids with {state.active}")
    if not np.array_equal(np.sort(positions[inside]), np.arange(n_aligned)):
        raise ProtocolError("alignment positions are not a permutation of the aligned rows")
    aligned = np.empty(n_aligned, dtype=np.int64)
    aligned[positions[inside]] = state.psi_order[inside]
    state.aligned = aligned
    state.valid = decode_mask(answer.valid, n_aligned)
