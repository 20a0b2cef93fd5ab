"""The active party encrypts a tree's gradients (SecureBoost Alg. 1 lines 1-3), with its
helper processes when it has some (``workers.crypto_shards``)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from boosting._typing import FloatArray
from boosting.fixedpoint import Quantized, quantize
from boosting.grow import TreeGrower
from boosting.losses import gradients
from boosting.privacy import PrivacyPlan, PrivateTree, clip_gradients, split_candidates, tree_rng
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from messages.bodies import Ack, Step
from messages.secureboost import EncryptedGradients, TreeStart
from messages.envelope import Kind, MsgType
from messages.instance_space import encode_mask
from workers import StageError, checkpoint
from workers.crypto_shards import encrypt_claimed, hand_out, take_units, to_bytes, wait_for_helpers
from workers.handlers import StepContext
from workers.state import JobState
from workers.vertical.active_state import ActiveTraining, Encryption, participants_of
from workers.vertical.draws import active_secret, tree_rows

log = logging.getLogger("fedboost.worker")

GRADIENT_CHUNK = 4096
"""Ciphertexts per message: 2 MiB at 2048-bit keys, well below broker message caps."""


def _private_tree(state: JobState, run: ActiveTraining, plan: PrivacyPlan, tree: int,
                  g: FloatArray) -> tuple[FloatArray, PrivateTree]:
    """DPBoost's tree ``tree``: gradients clipped to the bound, the tree's mechanisms and
    noise source (its rows of its ensemble are drawn in ``workers.vertical.draws``, without
    the data: the rows in a tree, which passive parties see, say nothing of gradients)."""
    # the passive parties' cuts are theirs: every bin of theirs is a candidate
    candidates: dict[int, npt.NDArray[np.bool_] | None] = {
        0: split_candidates([len(c) for c in state.cuts], run.params.max_bin)}
    return (clip_gradients(g, plan.bound),
            PrivateTree(plan, tree, candidates, tree_rng(run.noise_seed, tree)))


def encrypt_gradients(ctx: StepContext, body: Step) -> tuple[Kind, Any]:
    """Alg. 1 lines 1-3: g and h of the in-tree rows, packed, encrypted, sent to passive parties.

    With helper processes, the tree's chunks are claimed one at a time by this process and the
    helpers (workers.crypto_shards); the step completes when every chunk is sent."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    tree = body.tree
    if run.encrypting is not None and run.encrypting.work.tree == tree:
        return _finish_encryption(ctx, run, run.encrypting)
    if tree != len(run.trees):
        raise StageError(f"encrypt_gradients for tree {tree}, but {len(run.trees)} trees are done")
    output = tree % run.outputs
    if output == 0 or run.grads is None:  # one gradient computation per round
        run.grads = gradients(run.params.objective, run.margin, run.y)
    n = run.y.size
    # drawn from this party's own secret, never the spec's seed (workers.vertical.draws)
    in_tree = tree_rows(active_secret(checkpoint.key_of(ctx.party), state.digest), tree, n,
                        run.params.subsample, run.privacy)
    grad, hess, private = run.grads[0][:, output], run.grads[1][:, output], None
    if run.privacy is not None:
        grad, private = _private_tree(state, run, run.privacy, tree, grad)
        hess = np.ones_like(hess)
    g: Quantized = quantize(grad, n)
    h: Quantized = quantize(hess, n)
    run.grower = TreeGrower(run.params, g, h, in_tree, 1 + len(state.passives), private)
    participants = participants_of(state, run, tree)
    if participants:
        packer = GradientPacker(value_bits=g.bits, max_rows=n)
        packer.check_fits(run.public.plaintext_bits)
        run.packer = packer
        most = BinSumPacking.for_key(packer.cell_bits, run.public.plaintext_bits).per_ciphertext
        run.per_ciphertext = most if run.pack_bin_sums == "passive" else 1
        started = time.perf_counter()
        packed = packer.pack(g.ints[in_tree], h.ints[in_tree])
        start = TreeStart(tree=tree, in_tree=encode_mask(in_tree),
                          n_chunks=-(-len(packed) // GRADIENT_CHUNK), value_bits=g.bits, max_rows=n,
                          per_ciphertext=run.per_ciphertext)
        for passive in participants:
            ctx.send(passive, MsgType.TREE_START, start)
        width = max(1, (max(packed).bit_length() + 7) // 8) if packed else 1
        work = hand_out(ctx, "encrypt", tree, -1, run.sealed_key(ctx), run.public.n_bytes,
                        lambda: to_bytes(packed, width), len(packed), width, GRADIENT_CHUNK)
        if work is not None:
            run.encrypting = Encryption(participants, packed, work, started)
            _encrypt_claimed(ctx, run, run.encrypting)
            return _finish_encryption(ctx, run, run.encrypting)
        # each chunk goes out while the next is encrypted: passive parties take in (and pass
        # on to their helpers) the tree's gradients during the encryption, not after it
        for k, blob in enumerate(run.crypto_pool().encrypt_chunks(packed, GRADIENT_CHUNK)):
            for passive in participants:
                ctx.send(passive, MsgType.ENCRYPTED_GRADIENTS, EncryptedGradients(tree, k, blob))
        log.debug("%s t%d: encrypted and sent %d rows in %.3fs", ctx.party.name, tree,
                  int(in_tree.sum()), time.perf_counter() - started)
        run.prepare_encryption(len(packed), tree + 1)
    return MsgType.ACK, Ack(count=int(in_tree.sum()))


def _encrypt_claimed(ctx: StepContext, run: ActiveTraining, enc: Encryption) -> None:
    """Encrypt and send the chunks this process claims, while helpers do theirs."""
    work, began = enc.work, time.monotonic()
    for unit, blob in encrypt_claimed(run.crypto_pool(), lambda: ctx.claim(work.claims),
                                      work.units, lambda u: enc.packed[work.span(u)]):
        _send_chunk(ctx, enc, unit, blob)
    finished = time.monotonic()
    work.done_here = finished, finished - began


def _send_chunk(ctx: StepContext, enc: Encryption, unit: int, blob: bytes) -> None:
    for passive in enc.participants:
        ctx.send(passive, MsgType.ENCRYPTED_GRADIENTS, EncryptedGradients(enc.work.tree, unit,
                                                                          blob))
    enc.work.done[unit] = b""  # on its way: not kept


def _finish_encryption(ctx: StepContext, run: ActiveTraining,
                       enc: Encryption) -> tuple[Kind, Any]:
    """Pass the helpers' chunks on as they come; once they stop coming (a helper died),
    encrypt the chunks they left here."""
    work = enc.work
    for part in take_units(ctx, work, run.public.ciphertext_bytes):
        _send_chunk(ctx, enc, part.unit, part.result)
    wait_for_helpers(work)
    missing = work.missing()
    if missing:
        log.warning("%s t%d: %d gradient chunks did not come back from the helpers; "
                    "encrypting them here", ctx.party.name, work.tree, len(missing))
    for unit in missing:
        _send_chunk(ctx, enc, unit, run.crypto_pool().encrypt(enc.packed[work.span(unit)]))
    ctx.close_claims(work.claims)
    run.encrypting = None
    run.prepare_encryption(len(enc.packed), work.tree + 1)
    log.info("%s t%d: encrypted and sent %d rows in %.3fs, %d of %d chunks by helpers",
             ctx.party.name, work.tree, len(enc.packed), time.perf_counter() - enc.started,
             work.by_helpers, work.units)
    return MsgType.ACK, Ack(count=len(enc.packed))
