"""A SimFL member's preprocessing (seed 000, Algorithm 1): the members' secret hash functions,
this member's rows' hash values to the aggregator, the most similar rows back.

The hash functions come from a secret only the members hold, so that the aggregator cannot
rebuild the functions and invert them; it sees no hash value either, only each value's bucket
id keyed under the same secret (equal values, equal ids; no order, no distance). The first member
derives it (HMAC under its own checkpoint key of the federation's preprocessing key: the same
federation, data and LSH parameters give the same functions, so preprocessing again shows the
aggregator nothing new) and sends it to every other member sealed under a pair secret of
per-job X25519 keys (``workers.pairwise_masks``; the keys travel in signed envelopes, so
the aggregator, the flow and the broker cannot stand in the middle). One member choosing is
enough: any member could hand the secret to the aggregator, so contributions from all would
protect nothing more.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from boosting.tree import open_private
from messages import DecodeError
from messages.bodies import Ack, Step
from messages.e2e import decrypt_body, encrypt_body
from messages.envelope import Kind, MsgType
from messages.simfl import LshKey, LshSecret, MemberKey, Prepare, RowHashes, SimflSpec, SimilarRows
from workers import DataError, ProtocolError, StageError, checkpoint
from workers.handlers import StepContext
from workers.pairwise_masks import MaskKey, pair_secret
from workers.row_partitioned import aggregator_of, members_of
from workers.simfl.lsh import DEFAULT_R, LshFunctions, bucket_ids, default_functions
from workers.simfl.member import MAX_ROWS, SimflMember
from workers.simfl.privacy import derive_key, standard_normal

PREPARED_FORMAT = "simfl-prepared-2"
"""Part of the preprocessing key: 2 holds every other member's handles and comes from secret
functions; a format-1 file (functions from the public seed) is never found again."""


def lsh_of(spec: SimflSpec, n_features: int, secret: bytes) -> LshFunctions:
    """The job's hash functions: from the members' secret, the same at every member."""
    return LshFunctions.from_secret(secret, n_features,
                                    spec.lsh_functions or default_functions(n_features),
                                    spec.lsh_r or DEFAULT_R)


def leader_of(spec: SimflSpec) -> str:
    """The member that chooses the hash functions' secret: the first in the job's order."""
    return members_of(spec)[0]


def member_key(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """A keyed digest of this member's data set, the LSH parameters, the members and the
    objective: the same key again means its preprocessing still holds (without revealing the
    data's digest). Every member but the first also sends the first a fresh X25519 key for the
    functions' secret."""
    job: SimflMember = ctx.state
    s, me = job.spec, ctx.party.name
    h = hashlib.sha256()
    with open(job.data_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    # the objective too: its base score and classes are part of the record
    h.update(msgpack.packb([PREPARED_FORMAT, list(job.data.names), s.lsh_functions, s.lsh_r,
                            s.lsh_seed, members_of(s), me, s.params.objective], use_bin_type=True))
    key = hmac.new(checkpoint.key_of(ctx.party), h.digest(), hashlib.sha256).hexdigest()
    if me != leader_of(s) and job.exchange is None:
        job.exchange = MaskKey.generate()
        ctx.send(leader_of(s), MsgType.S_LSH_KEY, LshKey(job.exchange.public_bytes()))
    return MsgType.S_PREPARE_REPLY, MemberKey(key)


def _cache_file(ctx: StepContext, key: str) -> Path:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ProtocolError(f"{ctx.party.name}: preprocessing key {key!r} is not a digest")
    folder = ctx.party.private_dir() / "simfl"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{key}.npz"


def hash_rows(ctx: StepContext, body: Prepare) -> tuple[Kind, Any]:
    """Algorithm 1, l.1-4. Without ``force``: whether this federation's preprocessing is on
    record here (loaded; count: its trees per round, the classes or 1) or not (0). With it:
    the members' secret functions, and this member's rows' LSH values, as keyed bucket ids
    (``workers.simfl.lsh.bucket_ids``), under fresh opaque handles to the aggregator."""
    job: SimflMember = ctx.state
    cache = _cache_file(ctx, body.key)
    if not body.force:
        found = cache.is_file() and _load_prepared(job, cache, ctx.party.name)
        if found:
            job.prep_key = body.key
        return MsgType.ACK, Ack(count=job.classes if found else 0)
    secret = _functions_secret(ctx, job, body.key)
    functions = lsh_of(job.spec, job.data.x.shape[1], secret)
    buckets = bucket_ids(functions.hash(job.data.x), secret)  # what the aggregator may see
    handles = np.unique(np.frombuffer(secrets.token_bytes(8 * len(job.data.ids) * 2), "<u8"))
    handles = np.random.default_rng(secrets.randbits(64)).permutation(handles)[:len(job.data.ids)]
    if handles.size != len(job.data.ids):  # 2n random 64-bit values had n distinct
        raise ProtocolError(f"{ctx.party.name}: could not draw distinct row handles")
    job.handles, job.prep_key = handles.astype(np.uint64), body.key
    message = RowHashes(list(job.data.names), handles.astype("<u8").tobytes(),
                        buckets.astype("<u8").tobytes(), functions.a.shape[0],
                        _label_sum(ctx, job, body.key), _classes(job))
    ctx.send(aggregator_of(job.spec), MsgType.S_ROW_HASHES, message)
    return MsgType.ACK, Ack(count=len(message.handles) + len(message.hashes))


def _classes(job: SimflMember) -> int:
    """Multiclass: this member's highest label plus one (the union's classes are the largest
    of the members'); else 1."""
    return int(job.y.max()) + 1 if job.spec.params.objective == "multiclass" else 1


def _label_sum(ctx: StepContext, job: SimflMember, key: str) -> float:
    """The label sum for the base score; for 0/1 labels with Gaussian noise of the gradient
    sums' per-tree scale (one label moves it by 1), drawn once per preprocessing from this
    member's key, clipped to [0, rows]. A regression's sum of targets is sent as it is;
    multiclass sends none (its base score is 0 for every class)."""
    total = float(job.y.sum())
    if job.spec.params.objective == "multiclass":
        return 0.0
    if job.spec.params.objective != "binary":
        return total
    draw = standard_normal(derive_key(checkpoint.key_of(ctx.party), "simfl label sum v1", key), 1)
    return float(np.clip(total + job.spec.noise_tree * draw[0], 0.0, job.y.size))


def _functions_secret(ctx: StepContext, job: SimflMember, key: str) -> bytes:
    """The first member derives the secret and seals it to each other member; they open it.
    Waits (``NotReady``) until the keys, or the sealed secret, are in."""
    me, leader = ctx.party.name, leader_of(job.spec)
    if me == leader:
        others = [m for m in members_of(job.spec) if m != me]
        ctx.mailbox.require(*[(MsgType.S_LSH_KEY, m, -1, -1) for m in others])
        secret = derive_key(checkpoint.key_of(ctx.party), "simfl lsh secret v1", key)
        own = MaskKey.generate()
        for m in others:
            peer: LshKey = ctx.mailbox.take(MsgType.S_LSH_KEY, m)
            pair = pair_secret(own, peer.public, ctx.job, me, m)
            ctx.send(m, MsgType.S_LSH_SECRET, LshSecret(
                own.public_bytes(), encrypt_body(pair, secret, _sealed_for(ctx.job, me, m))))
        return secret
    if job.exchange is None:
        raise StageError(f"{me}: no key for the hash functions' secret (S_MEMBER_KEY first)")
    got: LshSecret = ctx.mailbox.take(MsgType.S_LSH_SECRET, leader)
    try:
        return decrypt_body(pair_secret(job.exchange, got.public, ctx.job, me, leader),
                            got.sealed, _sealed_for(ctx.job, leader, me))
    except DecodeError:
        raise ProtocolError(f"{me}: the hash functions' secret from {leader} does not open "
                            f"under this job's keys") from None


def _sealed_for(job: str, sender: str, recipient: str) -> bytes:
    return msgpack.packb(["simfl lsh secret v1", job, sender, recipient], use_bin_type=True)


def store_similar(ctx: StepContext, _: Step) -> tuple[Kind, Any]:
    """Algorithm 1, l.7-12 (done by the aggregator): keep the similar handles per other member
    and all its handles, on record under the federation's preprocessing key."""
    job: SimflMember = ctx.state
    me = ctx.party.name
    got: SimilarRows = ctx.mailbox.take(MsgType.S_SIMILAR, aggregator_of(job.spec))
    if got.columns != list(job.data.names):
        raise DataError(f"party {me}: file {job.data_file}: columns differ from the first "
                        f"member's: {_first_difference(list(job.data.names), got.columns)}")
    if not got.members:  # another member's columns differ: its own error names its file
        return MsgType.ACK, Ack(count=0)
    others = [m for m in members_of(job.spec) if m != me]
    n = len(job.data.ids)
    if got.members != others or any(len(h) != 8 * n for h in got.handles) or \
            len(got.everyone) != len(others) or \
            any(not 0 < len(e) <= 8 * MAX_ROWS or len(e) % 8 for e in got.everyone) or \
            not np.isfinite(got.base_score) or got.classes < _classes(job):
        raise ProtocolError(f"{me}: similar rows for {got.members} of wrong shape; expected "
                            f"{others}, {n} rows each")
    similar = [np.frombuffer(h, "<u8").astype(np.uint64) for h in got.handles]
    everyone = [np.frombuffer(e, "<u8").astype(np.uint64) for e in got.everyone]
    job.set_prepared(dict(zip(others, similar)), dict(zip(others, everyone)), got.base_score,
                     got.classes)
    with open_private(_cache_file(ctx, job.prep_key), "wb") as cache:
        arrays: dict[str, Any] = {f"similar_{k}": v for k, v in enumerate(similar)}
        arrays.update({f"everyone_{k}": v for k, v in enumerate(everyone)})
        np.savez(cache, handles=job.handles, base=np.float64(job.base), members=np.array(others),
                 classes=np.int64(job.classes), **arrays)
    return MsgType.ACK, Ack(count=sum(len(h) for h in [*got.handles, *got.everyone]))


def _load_prepared(job: SimflMember, path: Path, me: str) -> bool:
    """A preprocessing on record: handles, per other member the similar handles and all its
    handles, the base score and the classes (1 in records from before multiclass)."""
    with np.load(path, allow_pickle=False) as saved:
        handles = saved["handles"]
        others = [str(m) for m in saved["members"]]
        if handles.size != len(job.data.ids) or \
                others != [m for m in members_of(job.spec) if m != me] or \
                any(f"everyone_{k}" not in saved for k in range(len(others))):
            return False
        job.handles = handles.astype(np.uint64)
        job.set_prepared({m: saved[f"similar_{k}"] for k, m in enumerate(others)},
                         {m: saved[f"everyone_{k}"] for k, m in enumerate(others)},
                         float(saved["base"]),
                         int(saved["classes"]) if "classes" in saved else 1)
    return True


def _first_difference(mine: list[str], reference: list[str]) -> str:
    for k, (a, b) in enumerate(zip(mine, reference)):
        if a != b:
            return f"column {k + 1} is {a!r} here, {b!r} there"
    return f"{len(mine)} columns here, {len(reference)} there"
