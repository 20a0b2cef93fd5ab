"""The active party (label holder) in vertical SecureBoost (SecureBoost Alg. 1-2).

It holds labels, the private key, plaintext g/h and leaf values, and never sends any of them:
passive parties get only ciphertexts, the splits they own, and instance spaces.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from boosting.binning import goes_left, split_threshold
from boosting.fixedpoint import Quantized, quantize
from boosting.grow import TreeGrower, sample_rows
from boosting.hist import build_histograms
from boosting.losses import base_score, gradients, n_outputs, transform
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.split import SplitCandidate
from boosting.train import allowed_blocks
from boosting._typing import FloatArray
from boosting.tree import Model, Tree, node_values, save_model, write_json_atomic
from crypto.compress import BinSumPacking
from crypto.encoding import GradientPacker
from crypto.schemes import PrivateKey, PublicKey, generate_keypair
from crypto.pool import KeyHolderPool
from messages.bodies import (Ack, AppliedSplits, EncryptedGradients, EncryptedHistograms, Metric,
                             NodePositions, NodeSplit, Opened, OpenJob, ResumeJob, SplitChoice,
                             SplitChoices, SplitsFound, Step, TreeFinished, TreeStart)
from messages.envelope import MsgType
from messages.instance_space import decode_mask, encode_mask
from workers import ProtocolError, StageError, checkpoint
from workers.crypto_shards import (DECRYPT_UNIT, SharedCrypto, encrypt_claimed, from_bytes,
                                   hand_out, seal_key, take_units, to_bytes, wait_for_helpers)
from workers.vertical.opening import bin_active_rows, open_active
from workers.vertical.alignment import send_public_key
from workers.vertical.explain import SplitRecord, leaf_purity, tree_splits, write_splits
from workers.data import save_categories
from workers.lifeline import die_with_parent
from workers.runtime import StepContext
from workers.state import JobState

PROTOCOL = "vertical_secureboost"
"""The protocol whose steps this module and workers.vertical.passive answer (checked against policies)."""
PACKERS = ("key_holder", "passive")
"""Who may fold bin sums into shared ciphertexts (the job's ``crypto.pack_bin_sums``)."""
GRADIENT_CHUNK = 4096
"""Ciphertexts per message: 2 MiB at 2048-bit keys, well below broker message caps."""

log = logging.getLogger("fedboost.worker")


@dataclass(slots=True)
class ActiveTraining:
    """The active party's training state."""

    params: BoostParams
    public: PublicKey
    private: PrivateKey
    y: np.ndarray = field(default_factory=lambda: np.empty(0))
    n_classes: int = 0
    base: np.ndarray = field(default_factory=lambda: np.empty(0))
    margin: np.ndarray = field(default_factory=lambda: np.empty(0))
    grads: tuple[np.ndarray, np.ndarray] | None = None
    grower: TreeGrower | None = None
    packer: GradientPacker | None = None
    pack_bin_sums: str = "key_holder"
    """Who folds bin sums into shared ciphertexts (the job's ``crypto.pack_bin_sums``)."""
    per_ciphertext: int = 1
    """Bin sums per ciphertext the passive parties were told to send for this tree."""
    level_splits: dict[int, SplitCandidate | None] = field(default_factory=dict)
    trees: list[Tree] = field(default_factory=list)
    history: list[TreeFinished] = field(default_factory=list)
    """Training metrics after each tree (a resumed flow reports them again)."""
    score_margin: np.ndarray | None = None
    passive_features: dict[str, int] = field(default_factory=dict)
    """Each passive party's feature count, as its root histograms declared and bounded it."""
    pool: KeyHolderPool | None = None
    """Encryption/decryption processes (``crypto_processes``, default one per core), started
    with the first encrypted tree."""
    crypto_processes: int = 0
    """Cores this process encrypts and decrypts on (the worker's setting; 0: every core)."""
    make_ahead: bool = True
    """Make obfuscators ahead on idle CPU (the worker's setting)."""
    key_share: bytes = b""
    """The private key sealed for the party's own processes (``workers.crypto_shards``)."""
    encrypting: Encryption | None = None
    """The tree whose gradients are being encrypted, with helper processes."""
    decrypting: SharedCrypto | None = None
    """The level whose histograms are being decrypted, with helper processes."""
    splits: list[SplitRecord] = field(default_factory=list)
    """Every finished tree's splits with their gains (the run report's feature importance)."""
    staged_margin: np.ndarray | None = None
    """Validation margins after each tree (trees x rows x outputs), for the learning curve."""

    def crypto_pool(self) -> KeyHolderPool:
        if self.pool is None:
            self.pool = KeyHolderPool(self.private, self.crypto_processes or None,
                                      on_start=die_with_parent)
        return self.pool

    def prepare_encryption(self, rows: int, tree: int) -> None:
        """Have obfuscators for tree ``tree``'s ``rows`` made ahead on idle CPU
        (``crypto.pool``), such as while this party waits for the passive parties' histograms."""
        if self.make_ahead and tree < self.params.n_trees * self.outputs:
            self.crypto_pool().prepare(rows)

    def close(self) -> None:
        """Stop the crypto processes."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def sealed_key(self, ctx: StepContext) -> bytes:
        if not self.key_share:
            self.key_share = seal_key(ctx, self.private)
        return self.key_share

    def require_grower(self, tree: int) -> TreeGrower:
        if self.grower is None or len(self.trees) != tree:
            raise StageError(f"tree {tree} is not being grown (trees done: {len(self.trees)})")
        return self.grower

    @property
    def outputs(self) -> int:
        return n_outputs(self.params.objective, self.n_classes)

    def finish(self, margin: FloatArray) -> FloatArray:
        """Predictions from margins (what validation scoring sums)."""
        return transform(self.params.objective, margin)

    def scoring_model(self) -> Model:
        """The trees so far, for scoring the validation rows."""
        return self.model({})

    def model(self, features: dict[str, tuple[str, ...]]) -> Model:
        return Model(self.params, tuple(float(b) for b in self.base), self.n_classes,
                     tuple(self.trees), features)


checkpoint.register_state_types(ActiveTraining, SplitRecord)


def params_of(open_job: OpenJob) -> BoostParams:
    """Boosting parameters from a job spec."""
    spec = open_job.spec
    return BoostParams(**asdict(spec.params), complete_secure=spec.complete_secure)


def open_job(ctx: StepContext, body: OpenJob) -> tuple[MsgType, Any]:
    """Load labels and features, make the key pair (of the job's scheme)."""
    state = open_active(ctx, body.spec, PROTOCOL)
    if body.spec.pack_bin_sums not in PACKERS:
        raise ProtocolError(f"pack_bin_sums {body.spec.pack_bin_sums!r} is not one of {PACKERS}")
    params = params_of(body)
    public, private = generate_keypair(body.spec.scheme, body.spec.key_bits,
                                       obfuscator=ctx.party.policy.obfuscator)
    state.role_state = run = ActiveTraining(params=params, public=public, private=private,
                                            pack_bin_sums=body.spec.pack_bin_sums,
                                            crypto_processes=ctx.party.crypto_processes,
                                            make_ahead=ctx.party.make_ahead)
    run.crypto_pool()  # its processes start (and build their tables) during PSI
    run.prepare_encryption(len(state.data.ids), 0)  # on idle CPU only
    ctx.state = state
    return MsgType.OPENED, Opened(rows=len(state.data.ids),
                                  checkpoints=checkpoint.available(
                                      ctx.model_dir, state.digest, checkpoint.key_of(ctx.party)))


def _checkpoint(ctx: StepContext, state: JobState, trees_done: int) -> None:
    """Keep the job after ``trees_done`` trees: no processes, no tree in progress."""
    run: ActiveTraining = state.role_state
    checkpoint.save_job(ctx.model_dir, trees_done, state, run.public.n,
                        key=checkpoint.key_of(ctx.party), pool=None, grower=None, level_splits={},
                        key_share=b"", encrypting=None, decrypting=None)


def resume_job(ctx: StepContext, body: ResumeJob) -> tuple[MsgType, Any]:
    """Go back to the state of a checkpoint every party holds."""
    state = checkpoint.restore(ctx.model_dir, body.checkpoint, ctx.state,
                               checkpoint.key_of(ctx.party))
    run: ActiveTraining = state.role_state
    done = body.checkpoint.trees_done
    if len(run.trees) != done:
        raise checkpoint.CheckpointError(f"checkpoint holds {len(run.trees)} trees, not {done}")
    run.crypto_processes = ctx.party.crypto_processes  # this worker's, not the checkpoint's
    run.make_ahead = ctx.party.make_ahead
    run.prepare_encryption(run.y.size, done)
    ctx.state = state
    return MsgType.RESUMED, checkpoint.resumed(state, done, run.outputs, run.history)


def bin_features(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Bin own features on the training rows; set up labels and margins; send the public key."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    y, run.n_classes = bin_active_rows(state, run.params.objective, run.params.max_bin)
    run.y = y
    run.base = base_score(run.params.objective, y, run.n_classes)
    run.margin = np.tile(run.base, (y.size, 1))
    send_public_key(ctx, state, run.public)
    checkpoint.discard(ctx.model_dir)  # a fresh start: older checkpoints are of another run
    _checkpoint(ctx, state, 0)
    return MsgType.ACK, Ack(count=run.outputs)  # the flow needs the trees per round


def _participants(state: JobState, run: ActiveTraining, tree: int) -> list[str]:
    """Passive parties taking part in a tree (none in Completely SecureBoost's first round)."""
    blocks = allowed_blocks(run.params, tree, 1 + len(state.passives), run.outputs)
    return [state.passives[b - 1] for b in blocks if b > 0]


@dataclass(slots=True)
class Encryption:
    """A tree's encryption shared with helper processes: what goes to whom, and the units."""

    participants: list[str]
    packed: list[int]
    work: SharedCrypto
    started: float


def encrypt_gradients(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
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
    in_tree = sample_rows(n, run.params.subsample, run.params.seed, tree)
    g: Quantized = quantize(run.grads[0][:, output], n)
    h: Quantized = quantize(run.grads[1][:, output], n)
    run.grower = TreeGrower(run.params, g, h, in_tree, 1 + len(state.passives))
    participants = _participants(state, run, tree)
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
                       enc: Encryption) -> tuple[MsgType, Any]:
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


def _decrypt_histograms(run: ActiveTraining, msg: EncryptedHistograms, built: list[int],
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


def _decrypt_level(ctx: StepContext, run: ActiveTraining, participants: list[str],
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
        while (unit := ctx.claim(work.claims)) is not None:
            _decrypt_unit(run, work, unit, width, plain_width)
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
    out, first = {}, 0
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
    tree must declare the same count."""
    width = run.public.ciphertext_bytes
    if len(msg.ciphertexts) % width:
        raise ProtocolError(f"{sender} sent {len(msg.ciphertexts)} bytes of histograms, not a "
                            f"multiple of {width}")
    known = run.passive_features.get(sender)
    if msg.depth == 0:
        carried = msg.per_ciphertext * (len(msg.ciphertexts) // width)
        if msg.n_features > carried or known not in (None, msg.n_features):
            raise ProtocolError(f"{sender} declared {msg.n_features} features at the root, "
                                f"with {carried} bin sums (and {known} features before)")
        run.passive_features[sender] = msg.n_features
    elif msg.n_features != known:
        raise ProtocolError(f"{sender} declared {msg.n_features} features at depth "
                            f"{msg.depth}, {known} at the tree's root")


def find_best_splits(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Alg. 2: decrypt passive histograms, add own, pick each node's best split."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    participants = _participants(state, run, body.tree)
    ctx.mailbox.require(*[(MsgType.ENCRYPTED_HISTOGRAMS, p, body.tree, body.depth)
                          for p in participants])
    if grower.depth != body.depth:
        raise StageError(f"find_best_splits at depth {body.depth}, tree is at depth {grower.depth}")
    built = grower.nodes_to_build()
    plain = _decrypt_level(ctx, run, participants, body, built)  # before the grower changes
    bins = state.require_bins()
    slots = grower.slot_of_row(built)
    grower.add_histograms(0, built, build_histograms(bins, slots, grower.grad.ints,
                                                     grower.hess.ints, len(built), run.params.max_bin))
    for passive in participants:
        msg = ctx.mailbox.take(MsgType.ENCRYPTED_HISTOGRAMS, passive, body.tree, body.depth)
        block = 1 + state.passives.index(passive)
        grower.add_histograms(block, built, _decrypt_histograms(run, msg, built, passive,
                                                                plain[passive]))
    grower.begin_level()
    blocks = allowed_blocks(run.params, body.tree, 1 + len(state.passives), run.outputs)
    run.level_splits = grower.find_splits(blocks)
    owned: dict[str, list[SplitChoice]] = {}
    for node, split in run.level_splits.items():
        if split is not None and split.block > 0:
            owner = state.passives[split.block - 1]
            owned.setdefault(owner, []).append(
                SplitChoice(node=node, feature=split.feature, bin=split.bin,
                            missing_left=split.missing_left))
    for owner, choices in owned.items():
        ctx.send(owner, MsgType.SPLIT_CHOICES, SplitChoices(body.tree, body.depth, choices))
    n_splits = sum(s is not None for s in run.level_splits.values())
    return MsgType.SPLITS_FOUND, SplitsFound(
        owners=[p for p in state.passives if p in owned], n_splits=n_splits,
        n_leaves=len(run.level_splits) - n_splits)


def broadcast_nodes(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Apply the level's splits in node order and send every passive party the new positions."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    ctx.mailbox.require(*[(MsgType.APPLIED_SPLITS, o, body.tree, body.depth) for o in body.owners])
    applied = {}
    for owner in body.owners:
        msg: AppliedSplits = ctx.mailbox.take(MsgType.APPLIED_SPLITS, owner, body.tree, body.depth)
        for item in msg.splits:
            applied[(owner, item.node)] = item
    bins = state.require_bins()
    out: list[NodeSplit] = []
    for node in list(grower.frontier):
        split = run.level_splits.get(node)
        if split is None:
            continue
        rows = grower.node_rows(node)
        if split.block == 0:
            mask = goes_left(bins[rows, split.feature], split.bin, split.missing_left,
                             run.params.max_bin)
            left, right = grower.split_node(
                node, split, mask, owner=state.party,
                threshold=split_threshold(state.cuts[split.feature], split.bin))
        else:
            owner = state.passives[split.block - 1]
            item = applied.get((owner, node))
            if item is None:
                raise ProtocolError(f"{owner} did not apply the split of node {node}")
            mask = decode_mask(item.left, rows.size)
            left, right = grower.split_node(node, split, mask, owner=owner,
                                            record_id=item.record_id, hide_feature=True)
        out.append(NodeSplit(node=node, left_id=left, right_id=right, left=encode_mask(mask)))
    for passive in _participants(state, run, body.tree):
        ctx.send(passive, MsgType.NODE_POSITIONS, NodePositions(body.tree, body.depth, out))
    run.level_splits = {}
    return MsgType.ACK, Ack(count=len(grower.next_level()))


def finish_tree(ctx: StepContext, body: Step) -> tuple[MsgType, Any]:
    """Leaf weights, prediction update, training metrics."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    grower = run.require_grower(body.tree)
    if grower.frontier:
        raise StageError(f"tree {body.tree} still has {len(grower.frontier)} open nodes")
    run.splits.extend(tree_splits(body.tree, grower, state.party, state.passives))
    tree, node_of_row = grower.finish(body.tree % run.outputs)
    run.margin[:, tree.output] += node_values(tree)[node_of_row]
    run.trees.append(tree)
    run.grower = None
    ctx.mailbox.drop_tree(body.tree)
    metrics = evaluate(run.params.objective, run.y, transform(run.params.objective, run.margin),
                       "train")
    if run.params.objective in ("binary", "multiclass"):
        metrics["leaf_purity"] = leaf_purity(node_of_row, run.y)
    done = TreeFinished([Metric(k, v) for k, v in metrics.items()])
    run.history.append(done)
    _checkpoint(ctx, state, len(run.trees))
    return MsgType.TREE_FINISHED, done


def close_job(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Stop the job's crypto processes; the saved model stays."""
    state: JobState | None = ctx.state
    if state is not None and isinstance(state.role_state, ActiveTraining):
        state.role_state.close()
        checkpoint.discard(ctx.model_dir)  # the job is complete and its model saved
    return MsgType.ACK, Ack()


def save_model_part(ctx: StepContext, _: Step) -> tuple[MsgType, Any]:
    """Write the active party's model part: structure, owners, own thresholds, leaf values."""
    state: JobState = ctx.state
    run: ActiveTraining = state.role_state
    directory = ctx.model_dir
    features = {state.party: state.data.names, **{p: () for p in state.passives}}
    save_model(run.model(features), Path(directory) / "model.json")
    save_categories(Path(directory), state.data.categories)
    write_splits(Path(directory), ctx.job, state.party, run.splits)
    write_json_atomic(Path(directory) / "party.json", {
        "party": state.party, "role": "active", "job": ctx.job, "saved_at": time.time(),
        "parties": [state.party, *state.passives]})
    return MsgType.ACK, Ack(count=len(run.trees))
