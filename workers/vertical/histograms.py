"""A passive party's encrypted histograms (SecureBoost Alg. 1 lines 4-9), summed together
with its helper processes: a tree's gradients are passed on to them as they arrive, and each
level's features are claimed one at a time by this process and the helpers (``workers.shards``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from crypto.compress import BinSumPacking
from messages.bodies import Ack, Step
from messages.secureboost import (EncryptedGradients, EncryptedHistograms, HistogramShard,
                                  TreeCiphertexts, TreeStart)
from messages.envelope import Kind, MsgType
from messages.instance_space import encode_mask
from workers import NotReady, StageError
from workers.handlers import StepContext
from workers.shards import (LevelData, LevelWork, hold_tree_chunk, shard_data, shard_result,
                            sum_claimed)
from workers.state import JobState
from workers.vertical.passive import (PassiveTraining, apply_positions, arriving_tree,
                                     move_rows, record_splits, require_key, start_tree)
from workers.vertical.root_histogram import ArrivingTree, add_chunks

log = logging.getLogger("fedboost.worker")
_HAND_OUT = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hand-out")
"""Hands a level's data to the party's helpers while the step's thread sums (one at a time)."""


def gradients_arrived(ctx: StepContext, sender: str,
                      body: TreeStart | EncryptedGradients) -> None:
    """As a tree's gradients arrive (its start, then chunks): parse each chunk and sum it into
    the root's histograms (``workers.vertical.root_histogram``), or pass it on to the one
    helper; once all are here start the tree, before its first histograms are asked for.
    Whatever fails here fails again, and is answered, in that step."""
    state: JobState | None = ctx.state
    run = None if state is None else state.role_state
    if (state is None or not isinstance(run, PassiveTraining) or sender != state.active
            or run.tree >= body.tree or run.growing):
        return  # not training, this tree started already, or the previous one is not finished
    arrival = arriving_tree(ctx, state, run, body.tree)
    if arrival is None:
        return  # a chunk before its tree's start: taken up with the next one, or the tree
    key = (MsgType.ENCRYPTED_GRADIENTS, state.active, body.tree, -1)
    add_chunks(arrival, ctx.mailbox.items.get(key, []), state.require_bins(), require_key(run),
               run.params.max_bin + 1)
    if isinstance(body, EncryptedGradients):
        _pass_on_chunk(ctx, run, arrival, body)
    try:
        start_tree(ctx, state, run, body.tree)
    except NotReady:
        return  # more chunks to come


def _pass_on_chunk(ctx: StepContext, run: PassiveTraining, arrival: ArrivingTree,
                   chunk: EncryptedGradients) -> None:
    """With one helper, pass a gradient chunk on to it, sealed and published beside this
    thread; the tree's levels queue after it. With more, copies of a chunk on the shared work
    queue could all go to one helper (each takes whatever comes while it is free), so they get
    the tree with its first level instead (``_hand_out``)."""
    if run.public is None or arrival.helpers != 1:
        return
    _HAND_OUT.submit(_hand_out_chunk, ctx, TreeCiphertexts(
        tree=chunk.tree, chunk=chunk.chunk, n_chunks=arrival.start.n_chunks,
        n=run.public.n_bytes, ciphertexts=chunk.ciphertexts, scheme=run.public.scheme))


def _hand_out_chunk(ctx: StepContext, chunk: TreeCiphertexts) -> None:
    """Not waited for: a helper without the whole tree answers its shards empty, and this
    process sums what it left."""
    try:
        ctx.submit_work(MsgType.TREE_CIPHERTEXTS, chunk, before_ack=False)
    except Exception as exc:  # noqa: BLE001 - a failed hand-out costs time, never a result
        log.warning("%s: could not hand tree %d's chunk %d to the helpers: %r", ctx.party.name,
                    chunk.tree, chunk.chunk, exc)


def build_encrypted_histograms(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Alg. 1 lines 4-9: per node and feature, sum E(g, h, 1) per bin (smaller children only).

    With helper processes, the features are claimed one at a time by this process and the
    helpers (workers.shards); the step completes when every helper has answered.
    """
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    if run.level is None or run.level.key != (body.tree, body.depth):
        run.level = _start_level(ctx, state, run, body, _level_nodes(ctx, state, run, body))
    return _finish_level(ctx, state, run, body)


def apply_splits(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Alg. 2's last step (record the owned splits, return their instance spaces); told to
    build ahead, also Alg. 1 lines 4-9 of the next level at once, by the positions that came
    with the choices (``SplitChoices.build_ahead``): the level's second round trip saved."""
    state: JobState = ctx.state
    run: PassiveTraining = state.role_state
    ahead = Step(body.tree, body.depth + 1)
    if run.level is None or run.level.key != (ahead.tree, ahead.depth):  # not resumed
        applied, level = record_splits(ctx, body)
        if level is None:  # not told to build ahead
            return MsgType.ACK, Ack(count=len(applied))
        run.level = _start_level(ctx, state, run, ahead, move_rows(run, *level, ahead.depth))
    return _finish_level(ctx, state, run, ahead)


def _finish_level(ctx: StepContext, state: JobState, run: PassiveTraining,
                  body: Step) -> tuple[Kind, Any]:
    """Wait for the helpers' shares of the level, sum what they left and send the level."""
    work = run.level
    assert work is not None and work.key == (body.tree, body.depth)
    public, packing = require_key(run), work.data.packing
    answers = (MsgType.SHARD_HISTOGRAM, ctx.party.name, body.tree, body.depth)
    if not work.gives_up_on_helpers(time.monotonic()):
        ctx.mailbox.require(answers, counts=[work.tickets - len(work.answered)])
    for part in ctx.mailbox.take_all(*answers):
        work.add_answer(part, packing, public.ciphertext_bytes)
    run.level = None
    if work.pool:
        ctx.close_claims(work.pool)
    if len(work.answered) < work.tickets:
        log.warning("%s t%d d%d: %d of %d helpers did not answer; their features are summed "
                    "here", ctx.party.name, body.tree, body.depth,
                    work.tickets - len(work.answered), work.tickets)
    for feature in work.missing():  # claimed by a helper that never answered
        work.features[feature] = work.data.sum_features([feature])
    log.debug("%s t%d d%d: %d of %d features summed by helpers (in up to %.3fs), %d here",
              ctx.party.name, body.tree, body.depth, work.by_helpers, work.n_features,
              work.helper_seconds, work.n_features - work.by_helpers)
    _send_histograms(ctx, state, body, work.built, work.data, *work.merged())
    return MsgType.ACK, Ack(count=len(work.built))


def _send_histograms(ctx: StepContext, state: JobState, body: Step, built: list[int],
                     data: LevelData, widths: list[int], filled: np.ndarray,
                     ciphertexts: bytes) -> None:
    """Alg. 1 line 9: the level's encrypted histograms go to the active party."""
    ctx.send(state.active, MsgType.ENCRYPTED_HISTOGRAMS, EncryptedHistograms(
        tree=body.tree, depth=body.depth, nodes=built, n_features=data.codes.shape[1],
        n_bins=data.n_bins, shard_features=widths, filled=encode_mask(filled),
        per_ciphertext=data.packing.per_ciphertext, ciphertexts=ciphertexts))


def _level_nodes(ctx: StepContext, state: JobState, run: PassiveTraining,
                 body: Step) -> list[int]:
    """The level's nodes to build: the root of a started tree, or the smaller children of the
    previous level's splits, as the active party broadcast them."""
    if body.depth == 0:
        if run.tree != body.tree:  # its gradients came while another step ran, or just now
            start_tree(ctx, state, run, body.tree)
        elif run.depth != 0:
            raise StageError(f"build_histograms t{body.tree} d0: party is at t{run.tree} "
                             f"d{run.depth}")
        return [0]
    if run.tree != body.tree or run.depth != body.depth - 1:
        raise StageError(f"build_histograms t{body.tree} d{body.depth}: party is at "
                         f"t{run.tree} d{run.depth}")
    return apply_positions(ctx, state, run, body.tree, body.depth)


def _start_level(ctx: StepContext, state: JobState, run: PassiveTraining, body: Step,
                 built: list[int]) -> LevelWork:
    """Hand the level's nodes to the helpers and claim features here too."""
    started = time.perf_counter()
    public, bins, packing = require_key(run), state.require_bins(), run.packing
    if packing is None:
        raise StageError(f"build_histograms t{body.tree}: the tree's gradients have not arrived")
    node_rows = [np.flatnonzero((run.node_of_row == node) & run.in_tree) for node in built]
    rows, counts = np.concatenate(node_rows), [int(r.size) for r in node_rows]
    # the root is shared with the helpers the tree started with (or summed as it arrived); a
    # tree started without helpers is grown without them (a helper starting meanwhile joins
    # the next tree), so only one with helpers asks again per level, to notice one gone
    helpers = ctx.helpers() if body.depth and run.tree_helpers else run.tree_helpers
    pool = ctx.open_claims(bins.shape[1]) if helpers else ""
    # gathering, sealing and publishing the level's data runs beside this thread's summing
    handing_out = _HAND_OUT.submit(_hand_out, ctx, run, body, helpers, pool, packing, bins,
                                   rows, counts)
    data = LevelData(bins[rows], [run.tree_ciphertexts[i] for i in run.enc_index[rows].tolist()],
                     counts, run.params.max_bin + 1, public, packing)
    work = LevelWork(key=(body.tree, body.depth), built=built, n_bins=data.n_bins,
                     n_features=bins.shape[1], pool=pool, tickets=helpers, data=data)
    summing = time.monotonic()
    if helpers:
        work.features = sum_claimed(data, lambda: ctx.claim(pool))
    elif body.depth == 0 and run.root_sums is not None:
        work.together, run.root_sums = data.pack_sums(run.root_sums), None
    else:
        work.together = data.sum_features(list(range(data.codes.shape[1])))
    summed = time.monotonic()
    work.summed_here = summed, summed - summing
    handed_out = handing_out.result()  # its errors are this step's; acks wait for it
    log.debug("%s t%d d%d: %d helpers; handed out at %.3fs, %d features done here at %.3fs",
              ctx.party.name, body.tree, body.depth, helpers, handed_out - started,
              len(work.features), time.perf_counter() - started)
    return work


def _hand_out(ctx: StepContext, run: PassiveTraining, body: Step, helpers: int, pool: str,
              packing: BinSumPacking, bins: np.ndarray, rows: np.ndarray,
              counts: list[int]) -> float:
    """Queue the level's data for each helper: every bin code of its rows and where their
    ciphertexts are in the tree's; with several helpers, the tree's first level also brings the
    tree's ciphertexts (one helper got them chunk by chunk as they arrived).
    Returns when it was done (``time.perf_counter``)."""
    if helpers:
        shard = HistogramShard(
            tree=body.tree, depth=body.depth, shard=0, n=require_key(run).n_bytes,
            n_bins=run.params.max_bin + 1, n_features=bins.shape[1], rows=counts,
            bins=np.ascontiguousarray(bins[rows]).tobytes(),
            index=run.enc_index[rows].astype("<u4").tobytes(),
            tree_digest=run.tree_digest,
            tree_ciphertexts=b"".join(run.chunks) if body.depth == 0 and helpers > 1 else b"",
            cell_bits=packing.cell_bits,
            per_ciphertext=packing.per_ciphertext, claims=pool, scheme=require_key(run).scheme)
        for k in range(1, helpers + 1):
            ctx.submit_work(MsgType.HISTOGRAM_SHARD, replace(shard, shard=k))
    return time.perf_counter()


def histogram_shard(ctx: StepContext, body: HistogramShard) -> tuple[Kind, Any]:
    """Work step (a helper process of this party): sum the features it can claim."""
    started = time.perf_counter()
    data = shard_data(body)
    if data is None:  # this process does not hold the tree's ciphertexts: nothing to sum with
        return MsgType.SHARD_HISTOGRAM, shard_result(body, {}, started)
    done = sum_claimed(data, lambda: ctx.claim(body.claims))
    return MsgType.SHARD_HISTOGRAM, shard_result(body, done, started)


def tree_ciphertexts(_: StepContext, body: TreeCiphertexts) -> None:
    """Work step (a helper process of this party): keep a chunk of a tree's ciphertexts for
    its shards. Nothing is answered: a helper without the whole tree answers its shards empty."""
    hold_tree_chunk(body)
