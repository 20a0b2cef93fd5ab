"""The horizontal job's set-up, both roles: shared cuts from the union's counts on a public
grid (``workers.horizontal.grid``) and the base score from the union's label sum.

Round ``r`` (the flow's ``H_SUMMARIZE`` with depth ``r``): each member counts its non-missing
values in every cell of the round's layout and sends the counts masked for all members (in
round 0 also its column names and its masked ``[rows, label sum]``, or in multiclass
``[rows, rows of class 0, ..., rows of class MAX_CLASSES - 1]``). ``H_MERGE_BINS`` of the
same round: the aggregator sums them (the masks cancel only in the sum over all members) and
either tells the members which cells to split for round ``r + 1`` or sends every member the
cuts, the base score and the classes. ``H_APPLY_BINS``: each member bins its rows with them;
the aggregator answers the flow with the trees per round.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from boosting import BoostingError
from boosting._typing import FloatArray
from boosting.binning import apply_cuts, check_cuts
from boosting.losses import base_score_of_mean
from messages.bodies import Ack
from messages.envelope import Kind, MsgType
from messages.horizontal import MemberColumns, RefineCells, Round, SharedCuts
from workers import DataError, ProtocolError, StageError
from workers.horizontal import ledger
from workers.horizontal.aggregator import AggregatorJob, checkpoint_state, take_masked
from workers.horizontal.grid import MAX_ROUNDS, GridRounds, Layout, check_counts, count_columns
from workers.pairwise_masks import unmask_sum
from workers.horizontal.member import STATS_SCALE, checkpoint_state as save_member, members_of
from workers.horizontal.member_state import MemberJob
from workers.row_partitioned import MAX_CLASSES
from workers.horizontal.peers import announce_key, pair_secrets, send_masked
from workers.handlers import StepContext

MAX_FEATURES = 100_000
MAX_ROWS = 2**42
"""Rows a federation may have in all: every cumulative count stays exact in int64 and float64."""


def summarize_columns(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """A member's counts per cell for set-up round ``body.depth``, masked, to the aggregator
    (round 0: with its column names and masked row count and label sum)."""
    job: MemberJob = ctx.state
    round_ = body.depth
    members = members_of(job.spec)
    if round_ != job.grid_round + 1 or round_ >= MAX_ROUNDS:
        raise StageError(f"{ctx.party.name}: set-up round {round_} asked, round "
                         f"{job.grid_round} done")
    if round_ == 0:
        announce_key(ctx, job, members)
        pair_secrets(ctx, job, members)
        job.layouts = [Layout.coarse() for _ in job.data.names]
    else:
        refine: RefineCells = ctx.mailbox.take(MsgType.H_REFINE, job.aggregator, -1, round_)
        if refine.round != round_ or len(refine.cells) != len(job.layouts):
            raise ProtocolError(f"{ctx.party.name}: cells to split for round {refine.round} "
                                f"of {len(refine.cells)} features; expected round {round_} of "
                                f"{len(job.layouts)}")
        job.layouts = [layout.split(np.frombuffer(raw, "<i4").astype(np.int64), round_)
                       for layout, raw in zip(job.layouts, refine.cells)]
    counts = count_columns(job.data.x, job.layouts)
    if round_ == 0:
        ledger.opened(ctx.party.private_dir(), ctx.job, members, job.data_file, "setup")
        ctx.send(job.aggregator, MsgType.H_COLUMNS, MemberColumns(list(job.data.names)))
        send_masked(ctx, job, label_stats(job.params.objective, job.y), "stats", -1, -1, 0,
                    members)
    send_masked(ctx, job, counts, "grid", -1, round_, 0, members)
    job.grid_round = round_
    return MsgType.ACK, Ack(count=counts.size)


def label_stats(objective: str, y: FloatArray) -> np.ndarray:
    """A member's set-up stats, summed over members under masks: its rows, then its label sum
    (binary; regression in fixed point) or its rows per class (multiclass)."""
    if objective == "multiclass":
        counts = np.bincount(y.astype(np.int64), minlength=MAX_CLASSES)
        return np.concatenate([[y.size], counts]).astype(np.int64)
    label_sum = int(y.sum()) if objective == "binary" else \
        int(np.rint(y * STATS_SCALE).astype(np.int64).sum())
    return np.array([y.size, label_sum], dtype=np.int64)


def stats_length(objective: str) -> int:
    return 1 + MAX_CLASSES if objective == "multiclass" else 2


def merge_bins(ctx: StepContext, body: Round) -> tuple[Kind, Any]:
    """The aggregator sums round ``body.depth``'s counts: replies with the cells it asks the
    members to split next, or 0 once it sent every member the cuts and the base score. Members
    whose columns differ get no cuts (each then names its file)."""
    job: AggregatorJob = ctx.state
    members = members_of(job.spec)
    round_ = body.depth
    if round_ == 0:
        ctx.mailbox.require(*[(MsgType.H_COLUMNS, m, -1, -1) for m in members],
                            *[(MsgType.H_MASKED, m, -1, -1) for m in members],
                            *[(MsgType.H_MASKED, m, -1, 0) for m in members])
        if not _same_columns(ctx, job, members):
            return MsgType.ACK, Ack(count=0)
        stats = [take_masked(ctx, m, "stats", -1, -1, 0, stats_length(job.params.objective))
                 for m in members]
        job.stats = tuple(int(v) for v in unmask_sum(stats))
        job.grid = GridRounds.start(len(job.columns), job.spec.summary_size,
                                    job.params.max_bin)
    grid = job.grid
    if grid is None or round_ != grid.round:
        raise StageError(f"{ctx.party.name}: set-up round {round_} asked; the aggregator is at "
                         f"{None if grid is None else grid.round}")
    ctx.mailbox.require(*[(MsgType.H_MASKED, m, -1, round_) for m in members])
    masked = [take_masked(ctx, m, "grid", -1, round_, 0, sum(grid.cells())) for m in members]
    counts = grid.unflatten(unmask_sum(masked))
    rows = job.stats[0]
    for j, c in enumerate(counts):
        check_counts(c, rows, f"{ctx.party.name}: feature {j}")
    chosen = grid.advance(counts)
    if chosen is not None:
        refine = RefineCells(grid.round, [c.astype("<i4").tobytes() for c in chosen])
        for m in members:
            ctx.send(m, MsgType.H_REFINE, refine)
        return MsgType.ACK, Ack(count=sum(c.size for c in chosen))
    cuts = grid.cuts(counts)
    job.bin_counts = grid.bin_counts(counts, cuts, rows)
    _send_cuts(ctx, job, cuts, members)
    job.grid = None
    return MsgType.ACK, Ack(count=0)


def _same_columns(ctx: StepContext, job: AggregatorJob, members: list[str]) -> bool:
    """Take the members' column names; tell every member when they differ."""
    received = [ctx.mailbox.take(MsgType.H_COLUMNS, m).columns for m in members]
    reference = received[0]
    if len(reference) > MAX_FEATURES:
        raise ProtocolError(f"{ctx.party.name}: the members have {len(reference)} columns, at "
                            f"most {MAX_FEATURES}")
    if any(r != reference for r in received):
        for m in members:  # each member then names its own file and its difference
            ctx.send(m, MsgType.H_CUTS, SharedCuts(list(reference), [], float("nan"), 0))
        job.columns_differ = True
        return False
    job.columns = list(reference)
    return True


def _send_cuts(ctx: StepContext, job: AggregatorJob, cuts: list[FloatArray],
               members: list[str]) -> None:
    """The cuts and the base score (from the summed label sum) or, in multiclass, the classes
    (from the summed counts per class) to every member."""
    rows = job.stats[0]
    if not 0 < rows <= MAX_ROWS:
        raise ProtocolError(f"{ctx.party.name}: the members' row counts sum to {rows}")
    job.cuts = cuts
    if job.params.objective == "multiclass":
        job.base, job.classes = 0.0, union_classes(ctx.party.name, job.stats[1:], rows)
    else:
        label_sum = job.stats[1]
        mean = label_sum / rows if job.params.objective == "binary" else \
            label_sum / STATS_SCALE / rows
        job.base = float(base_score_of_mean(job.params.objective, mean)[0])
    job.run = run_of(job.cuts, job.base, job.classes)
    shared = SharedCuts(list(job.columns), [np.asarray(c, dtype="<f8").tobytes() for c in cuts],
                        job.base, job.classes)
    for m in members:
        ctx.send(m, MsgType.H_CUTS, shared)
    checkpoint_state(ctx, job)


def union_classes(me: str, counts: tuple[int, ...], rows: int) -> int:
    """The classes of the union's labels from its rows per class: the highest label present
    plus one (``boosting.losses.check_labels``); refused when they are not counts of the rows
    or hold a single class."""
    per_class = np.asarray(counts, dtype=np.int64)
    if (per_class < 0).any() or int(per_class.sum()) != rows:
        raise ProtocolError(f"{me}: the summed rows per class are not counts of the {rows} rows")
    present = np.flatnonzero(per_class)
    if present.size < 2:
        raise DataError(f"the members' multiclass labels hold a single class "
                        f"({int(present[0]) if present.size else 'none'}); nothing to learn")
    return int(present[-1]) + 1


def outputs_per_round(ctx: StepContext, _: Round) -> tuple[Kind, Any]:
    """The aggregator, once the cuts are out: the trees per round (the classes, or 1), which
    the flow needs to count the trees."""
    job: AggregatorJob = ctx.state
    if job.columns_differ:  # the members' own errors name their files: not this party's to say
        return MsgType.ACK, Ack(count=0)
    if not job.cuts:
        raise StageError(f"{ctx.party.name}: no cuts sent yet")
    return MsgType.ACK, Ack(count=job.classes)


def apply_bins(ctx: StepContext, _: Round) -> tuple[Kind, Any]:
    """Bin the rows with the shared cuts (each an edge of this member's last grid); start
    every margin at the shared base score."""
    job: MemberJob = ctx.state
    shared: SharedCuts = ctx.mailbox.take(MsgType.H_CUTS, job.aggregator)
    me = ctx.party.name
    if shared.columns != list(job.data.names):
        raise DataError(f"party {me}: file {job.data_file}: columns differ from the first "
                        f"member's: {_first_difference(list(job.data.names), shared.columns)}")
    if not shared.cuts:  # another member's columns differ: its own error names its file
        return MsgType.ACK, Ack(count=0)
    if not math.isfinite(shared.base_score) or len(shared.cuts) != len(job.data.names):
        raise ProtocolError(f"{me}: the aggregator sent {len(shared.cuts)} cut lists for "
                            f"{len(job.data.names)} columns")
    multiclass = job.params.objective == "multiclass"
    fits = (2 <= shared.classes <= MAX_CLASSES and job.y.max() < shared.classes
            and shared.base_score == 0.0) if multiclass else shared.classes == 1
    if not fits:
        raise ProtocolError(f"{me}: the aggregator's {shared.classes} classes (base score "
                            f"{shared.base_score}) do not fit this member's "
                            f"{job.params.objective} labels")
    cuts = [np.frombuffer(raw, dtype="<f8").astype(np.float64) for raw in shared.cuts]
    try:
        check_cuts(cuts, len(cuts), job.params.max_bin)
    except BoostingError as exc:  # the aggregator's doing, not this member's input
        raise ProtocolError(f"{me}: the aggregator's cuts: {exc}") from None
    if len(job.layouts) != len(cuts) or not all(
            np.isin(c[:-1], layout.edges).all() for c, layout in zip(cuts, job.layouts)):
        raise ProtocolError(f"{me}: the aggregator's cuts are not edges of the set-up grid")
    job.cuts, job.base, job.classes = cuts, float(shared.base_score), shared.classes
    job.bins = apply_cuts(job.data.x, cuts, job.params.max_bin)
    job.margin = np.full((job.y.size, job.classes), job.base)
    job.run = run_of(cuts, job.base, job.classes)
    job.layouts = []
    save_member(ctx, job)
    return MsgType.ACK, Ack(count=job.y.size)


def _first_difference(mine: list[str], reference: list[str]) -> str:
    for k, (a, b) in enumerate(zip(mine, reference)):
        if a != b:
            return f"column {k + 1} is {a!r} here, {b!r} there"
    return f"{len(mine)} columns here, {len(reference)} there"


def run_of(cuts: list[FloatArray], base: float, classes: int = 1) -> str:
    """A training run's id: a digest of its shared cuts, base score and classes (every party
    has them)."""
    h = hashlib.sha256(np.float64(base).tobytes())
    if classes != 1:  # runs of one output keep the ids they had before multiclass
        h.update(f"classes {classes}".encode())
    for c in cuts:
        h.update(np.asarray(c, dtype="<f8").tobytes())
    return h.hexdigest()[:16]
