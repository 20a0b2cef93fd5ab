"""The active party decrypts the passive parties' encrypted histograms (SecureBoost Alg. 2
line 1), checked against the level first, with its helper processes when it has some
(``workers.crypto_shards``)."""

from __future__ import annotations

import logging
import time

import numpy as np

from crypto.compress import BinSumPacking
from messages.bodies import Step
from messages.secureboost import EncryptedHistograms
from messages.envelope import MsgType
from messages.instance_space import decode_mask
from workers import ProtocolError, StageError
from workers.crypto_shards import (DECRYPT_UNIT, SharedCrypto, from_bytes, hand_out, take_units,
                                   to_bytes, wait_for_helpers)
from workers.handlers import StepContext
from workers.vertical.active_state import ActiveTraining

log = logging.getLogger("fedboost.worker")


def decrypt_histograms(run: ActiveTraining, msg: EncryptedHistograms, built: list[int],
                        sender: str, plain: list[int] | None = None) -> np.ndarray:
    """Decrypt (unless ``plain`` holds them, decrypted with helpers) and unpack a passive
    party's histograms to exact (g, h, count) sums. Sent one per ciphertext, the bin sums are
    folded here (``decrypt_sums``) and ``plain`` holds the sums themselves; packed by the
    passive party, ``plain`` holds its packed plaintexts."""
    packing, segments, counts = _layout(run, msg, built, sender)
    folded = packing.per_ciphertext == 1
    if plain is None:
        plain = (run.crypto_pool().decrypt_sums(msg.ciphertexts, packing.cell_bits) if folded
                 else run.crypto_pool().decrypt(msg.ciphertexts))
    blocks, start = [], 0
    for features, seg, count in zip(msg.shard_features, segments, counts, strict=True):
        sums = np.zeros((len(built) * features * msg.n_bins, 3), dtype=np.int64)  # empty: zero
        cells = (plain[start:start + count] if folded
                 else packing.unpack(plain[start:start + count], seg.size, masked=True))
        for k, m in zip(seg.tolist(), cells):
            sums[k] = run.packer.unpack_sum(m)  # type: ignore[union-attr]  # _layout checked it
        blocks.append(sums.reshape(len(built), features, msg.n_bins, 3))
        start += count
    return np.concatenate(blocks, axis=1)


def _layout(run: ActiveTraining, msg: EncryptedHistograms, built: list[int],
            sender: str) -> tuple[BinSumPacking, list[np.ndarray], list[int]]:
    """Check a passive party's histograms against the level; their packing, each shard's
    filled bins and ciphertext count."""
    if msg.nodes != built:
        raise ProtocolError(f"{sender} built histograms of nodes {msg.nodes}, expected {built}")
    if msg.n_bins != run.params.max_bin + 1 or msg.n_features < 1:
        raise ProtocolError(f"{sender} sent histograms of {msg.n_features} x {msg.n_bins} bins")
    if run.packer is None:
        raise StageError("histograms arrived before any gradients were encrypted")
    if msg.per_ciphertext != run.per_ciphertext:
        raise ProtocolError(f"{sender} packed {msg.per_ciphertext} bin sums per ciphertext; "
                            f"the tree's gradients asked for {run.per_ciphertext}")
    if not msg.shard_features or min(msg.shard_features) < 1 \
            or sum(msg.shard_features) != msg.n_features:
        raise ProtocolError(f"{sender} sent shards of {msg.shard_features} features for "
                            f"{msg.n_features}")
    _check_feature_count(run, msg, sender)  # before anything is sized by it
    packing = BinSumPacking(run.packer.cell_bits, msg.per_ciphertext)
    nodes, width = len(built), run.public.ciphertext_bytes
    filled = decode_mask(msg.filled, nodes * msg.n_features * msg.n_bins)
    # each shard's filled bins are packed on their own: segment the mask and the ciphertexts
    segments, first = [], 0
    for features in msg.shard_features:
        cells = nodes * features * msg.n_bins
        segments.append(np.flatnonzero(filled[first:first + cells]))
        first += cells
    counts = [packing.n_ciphertexts(seg.size) for seg in segments]
    if len(msg.ciphertexts) != sum(counts) * width:
        raise ProtocolError(f"{sender} sent {len(msg.ciphertexts)} bytes of histograms, expected "
                            f"{sum(counts)} ciphertexts of {width} bytes")
    return packing, segments, counts


def decrypt_level(ctx: StepContext, run: ActiveTraining, participants: list[str],
                   body: Step, built: list[int]) -> dict[str, list[int] | None]:
    """Each passive party's histograms decrypted, in units claimed by this process and its
    helpers (workers.crypto_shards); None for each when they are decrypted here, unshared."""
    width, plain_width = run.public.ciphertext_bytes, len(run.public.n_bytes)
    work = run.decrypting
    if work is None or (work.tree, work.depth) != (body.tree, body.depth):
        msgs = [ctx.mailbox.items[(MsgType.ENCRYPTED_HISTOGRAMS, p, body.tree, body.depth)][0]
                for p in participants]
        for passive, msg in zip(participants, msgs):
            _layout(run, msg, built, passive)  # nothing unchecked goes to the helpers
        if not msgs:  # a tree of the active party's features only (Completely SecureBoost)
            return {}
        blob = b"".join(msg.ciphertexts for msg in msgs)
        cell_bits = run.packer.cell_bits  # type: ignore[union-attr]  # _layout checked it
        # sums sent one per ciphertext are folded in units of whole runs
        op, unit = (("fold", DECRYPT_UNIT // run.private.fold_run(cell_bits) *
                     run.private.fold_run(cell_bits)) if run.per_ciphertext == 1
                    else ("decrypt", DECRYPT_UNIT))
        work = hand_out(ctx, op, body.tree, body.depth, run.sealed_key(ctx),
                        run.public.n_bytes, lambda: blob, len(blob) // width, width, unit,
                        cell_bits=cell_bits if op == "fold" else 0)
        if work is None:
            return {p: None for p in participants}
        run.decrypting, work.inputs, began = work, blob, time.monotonic()
        while (claimed := ctx.claim(work.claims)) is not None:
            _decrypt_unit(run, work, claimed, width, plain_width)
        finished = time.monotonic()
        work.done_here = finished, finished - began
    take_units(ctx, work, plain_width)
    wait_for_helpers(work)
    for unit in work.missing():  # claimed by a helper that never answered
        _decrypt_unit(run, work, unit, width, plain_width)
    ctx.close_claims(work.claims)
    run.decrypting = None
    log.debug("%s t%d d%d: %d of %d decryption units by helpers", ctx.party.name, body.tree,
              body.depth, work.by_helpers, work.units)
    plain = from_bytes(b"".join(work.done[u] for u in range(work.units)), plain_width)
    out: dict[str, list[int] | None] = {}
    first = 0
    for passive in participants:
        count = len(ctx.mailbox.items[(MsgType.ENCRYPTED_HISTOGRAMS, passive, body.tree,
                                       body.depth)][0].ciphertexts) // width
        out[passive], first = plain[first:first + count], first + count
    return out


def _decrypt_unit(run: ActiveTraining, work: SharedCrypto, unit: int, width: int,
                  plain_width: int) -> None:
    if not 0 <= unit < work.units or unit in work.done:
        raise ProtocolError(f"claimed decryption unit {unit} of {work.units} twice or out of "
                            f"range")
    span = work.span(unit)
    inputs = work.inputs[span.start * width:span.stop * width]
    plain = (run.crypto_pool().decrypt_sums(inputs, work.cell_bits) if work.op == "fold"
             else run.crypto_pool().decrypt(inputs))
    work.done[unit] = to_bytes(plain, plain_width)


def _check_feature_count(run: ActiveTraining, msg: EncryptedHistograms, sender: str) -> None:
    """Bound a passive party's declared feature count by what this party can check before it
    allocates node x feature x bin sums: every feature of the root has a filled bin, so at
    depth 0 there are no more features than bin sums the ciphertexts carry; later levels of the
    tree must declare the same count. A tree of no rows (only under DP, ``_tree_has_no_rows``)
    has no filled bin: its histograms carry nothing and declare the count known already."""
    width = run.public.ciphertext_bytes
    if len(msg.ciphertexts) % width:
        raise ProtocolError(f"{sender} sent {len(msg.ciphertexts)} bytes of histograms, not a "
                            f"multiple of {width}")
    known = run.passive_features.get(sender)
    if _tree_has_no_rows(run):
        # under DP a tree may be dealt no rows: every bin of every node is empty, and nothing
        # of the message bounds the count, so it must be the one of an earlier tree's root
        if msg.ciphertexts or known != msg.n_features:
            raise ProtocolError(f"{sender} sent {len(msg.ciphertexts) // width} ciphertexts of "
                                f"{msg.n_features} features at depth {msg.depth} of a tree of "
                                f"no rows; expected none, of the {known} features declared "
                                f"before")
    elif msg.depth == 0:
        carried = msg.per_ciphertext * (len(msg.ciphertexts) // width)
        if msg.n_features > carried or known not in (None, msg.n_features):
            raise ProtocolError(f"{sender} declared {msg.n_features} features at the root, "
                                f"with {carried} bin sums (and {known} features before)")
        run.passive_features[sender] = msg.n_features
    elif msg.n_features != known:
        raise ProtocolError(f"{sender} declared {msg.n_features} features at depth "
                            f"{msg.depth}, {known} at the tree's root")


def _tree_has_no_rows(run: ActiveTraining) -> bool:
    """The tree being grown is private and was dealt no rows (DPBoost's shares ``eta
    (1 - eta)^t`` leave the last trees of a large ensemble none). Without DP an honest job never
    grows such a tree, and a root without filled bins stays refused."""
    return (run.privacy is not None and run.grower is not None
            and not bool(run.grower.in_tree.any()))
