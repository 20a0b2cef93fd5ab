"""The active party's Paillier (or OU) work shared among its processes, unit by unit.

With ``fedboost worker --party <active> --processes N``, the coordinating process hands a
tree's encryption (one unit per gradient chunk) and a level's decryption (units of
``DECRYPT_UNIT`` ciphertexts) to its helper processes through a claim pool, as a passive party
shares its histogram sums (``workers.shards``): every process takes one unit at a time until
none is left, and each helper returns every unit's result to the coordinating process as soon
as it is done. The coordinating process passes ciphertexts on to the passive parties as they
come (it alone talks to them: the passive side's protocol is unchanged), and does here any unit
a helper claimed but never returned (a helper that died), so a step never waits on a lost unit.
Decryption is exact and every encryption of a gradient decrypts to it, so the model is the same
however the work was shared; only the ciphertexts' random factors differ.

How the job's private key reaches the helpers: every shard carries it, sealed
(ChaCha20-Poly1305) under a key derived from the party's own Ed25519 signing key
(``messages.e2e.own_key``) and bound to the job and the key's modulus. Only a process that
holds ``<party>.key`` opens it; the broker's operator and the other parties see ciphertext,
whatever ``signing.end_to_end`` says. The shard's inputs (plaintext gradients) and a decryption
unit's result travel sealed the same way. So every machine that runs a process of the active
party holds the private key of each job it helps with, in memory only (never written, never
logged: a private key prints no factor); a helper keeps the keys of at most
``KEPT_KEYS`` jobs, and uses a key only for shards of the job it is bound to.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import msgpack

from crypto._gmp import mpz
from crypto.schemes import PrivateKey, private_key_from_factors
from crypto.pool import KeyHolderPool
from messages import DecodeError
from messages.secureboost import CryptoShard, CryptoUnit
from messages.e2e import decrypt_body, encrypt_body
from messages.envelope import MsgType
from workers import NotReady, ProtocolError
from workers.handlers import StepContext
from workers.lifeline import die_with_parent
from workers.shards import HELPER_GRACE, MAX_KEY_BYTES, MIN_HELPER_WAIT

log = logging.getLogger("fedboost.worker")

OPS = ("encrypt", "decrypt", "fold")
"""``fold``: decrypt bin sums sent one per ciphertext, folded below p (``crypto.compress``)."""
DECRYPT_UNIT = 32
"""Ciphertexts per decryption unit; a level with fewer than two units is decrypted here (a
round trip to a helper would cost more than it saves)."""
KEPT_KEYS = 2
"""Jobs whose private keys (and crypto processes) a helper keeps at once."""
_PURPOSE = b"fedboost active party's own processes v1"


def _key(ctx: StepContext) -> bytes:
    return ctx.own_key(_PURPOSE)


def seal_key(ctx: StepContext, private: PrivateKey) -> bytes:
    """The job's private key, sealed for the party's own processes and bound to the job."""
    n = private.public_key.n_bytes
    factors = msgpack.packb([int(private.p).to_bytes(len(n), "big"),
                             int(private.q).to_bytes(len(n), "big"), private.obfuscator,
                             private.public_key.scheme])
    return encrypt_body(_key(ctx), factors, _bound("key", ctx.job, n))


def open_key(ctx: StepContext, n: bytes, sealed: bytes) -> PrivateKey:
    """The private key a shard carries; ``ProtocolError`` unless this party sealed it for this
    job and modulus."""
    try:
        p, q, obfuscator, scheme = msgpack.unpackb(decrypt_body(_key(ctx), sealed,
                                                                _bound("key", ctx.job, n)))
        return private_key_from_factors(scheme, mpz(int.from_bytes(n, "big")),
                                        mpz(int.from_bytes(p, "big")),
                                        mpz(int.from_bytes(q, "big")), obfuscator)
    except DecodeError:
        raise ProtocolError(f"{ctx.party.name}: a shard's private key is not sealed by this "
                            f"party for job {ctx.job!r}: refused") from None
    except Exception as exc:  # a sealed but malformed key: this party's own bug, not a forgery
        raise ProtocolError(f"{ctx.party.name}: a shard's private key does not load: "
                            f"{type(exc).__name__}") from None


def _bound(what: str, job: str, *parts: bytes | str | int) -> bytes:
    """What a sealed part is bound to (its additional data): it opens nowhere else."""
    return msgpack.packb([_PURPOSE, what, job, *parts])


def to_bytes(values: Sequence[int], width: int) -> bytes:
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def from_bytes(blob: bytes, width: int) -> list[int]:
    return [int.from_bytes(blob[i:i + width], "big") for i in range(0, len(blob), width)]


@dataclass(slots=True)
class SharedCrypto:
    """One step's shared Paillier work at the coordinating process: the claim pool and what is
    done. ``done`` maps a unit to its result (ciphertexts, or plaintexts), or to b"" once an
    encrypted chunk is on its way to the passive parties."""

    tree: int
    depth: int
    op: str
    claims: str
    units: int
    unit: int
    count: int
    cell_bits: int = 0
    """Bits of a bin sum (``fold``)."""
    done: dict[int, bytes] = field(default_factory=dict)
    by_helpers: int = 0
    done_here: tuple[float, float] | None = None
    """When this process finished its own units (``time.monotonic``) and how long they took."""
    inputs: bytes = b""
    """The coordinating process's copy of the inputs, to do what no helper returned."""

    def span(self, unit: int) -> slice:
        return slice(unit * self.unit, min((unit + 1) * self.unit, self.count))

    def gives_up_on_helpers(self, now: float) -> bool:
        """As ``workers.shards.LevelWork.gives_up_on_helpers``: a helper still silent
        ``HELPER_GRACE`` times this process's own share after it finished has died or stalled."""
        if self.done_here is None:
            return False
        finished, took = self.done_here
        return now - finished > max(MIN_HELPER_WAIT, HELPER_GRACE * took)

    def missing(self) -> list[int]:
        return [u for u in range(self.units) if u not in self.done]

    def check_unit(self, part: CryptoUnit, width: int) -> None:
        """A helper's unit must be of this step, new, and of exactly its values' size
        (``width`` bytes a result: a ciphertext, or a plaintext)."""
        span = self.span(part.unit)
        expected = (span.stop - span.start) * width
        if part.claims != self.claims or part.tree != self.tree or part.depth != self.depth:
            raise ProtocolError(f"{self.op} unit of another step (t{part.tree} d{part.depth})")
        if not 0 <= part.unit < self.units or part.unit in self.done:
            raise ProtocolError(f"{self.op} unit {part.unit} of {self.units} twice or out of "
                                f"range")
        if len(part.result) != expected:
            raise ProtocolError(f"{self.op} unit {part.unit}: {len(part.result)} bytes, "
                                f"expected {expected}")


def hand_out(ctx: StepContext, op: str, tree: int, depth: int, key: bytes, n: bytes,
             values: Callable[[], bytes], count: int, width: int,
             unit: int, cell_bits: int = 0) -> SharedCrypto | None:
    """Open a pool of the step's units and queue a shard for each helper process; None (do it
    all here) when the party has no helper, or the step has fewer than two units. ``values``
    gives the ``count`` inputs, ``width`` bytes each."""
    helpers = ctx.helpers()
    units = -(-count // unit)
    if helpers < 1 or units < 2:
        return None
    claims = ctx.open_claims(units)
    data = encrypt_body(_key(ctx), values(), _bound("data", ctx.job, claims, op, tree, depth))
    shard = CryptoShard(tree=tree, depth=depth, op=op, n=n, key=key, claims=claims, unit=unit,
                        count=count, width=width, data=data, cell_bits=cell_bits)
    for _ in range(helpers):
        ctx.submit_work(MsgType.CRYPTO_SHARD, shard)
    return SharedCrypto(tree, depth, op, claims, units, unit, count, cell_bits)


def take_units(ctx: StepContext, work: SharedCrypto, width: int) -> list[CryptoUnit]:
    """The helpers' units that came for this step since the last call (checked; decryption
    results opened). ``width``: bytes of one value of a result."""
    parts = []
    for part in ctx.mailbox.take_all(MsgType.CRYPTO_UNIT, ctx.party.name, work.tree, work.depth):
        if part.claims != work.claims:
            continue  # a late answer of an earlier try of this step
        if work.op != "encrypt":
            part = _open_result(ctx, work, part)
        work.check_unit(part, width)
        work.done[part.unit] = part.result
        work.by_helpers += 1
        parts.append(part)
    return parts


def wait_for_helpers(work: SharedCrypto) -> None:
    """``NotReady`` while units are missing and the helpers are still given time."""
    missing = work.missing()
    if missing and not work.gives_up_on_helpers(time.monotonic()):
        raise NotReady(f"{len(missing)} {work.op} units from this party's helper processes")


def _open_result(ctx: StepContext, work: SharedCrypto, part: CryptoUnit) -> CryptoUnit:
    try:
        plain = decrypt_body(_key(ctx), part.result,
                             _bound("result", ctx.job, work.claims, part.unit))
    except DecodeError:
        raise ProtocolError(f"decryption unit {part.unit}: not sealed by this party for this "
                            f"step: refused") from None
    return CryptoUnit(part.tree, part.depth, part.claims, part.unit, plain, part.seconds)


def encrypt_claimed(pool: KeyHolderPool, claim: Callable[[], int | None], units: int,
                    plaintexts: Callable[[int], Sequence[int]]) -> Iterator[tuple[int, bytes]]:
    """Encrypt the units ``claim`` hands out, one claimed ahead: each unit's ciphertexts are
    yielded (to be sent) while the next unit is encrypted."""
    ahead: tuple[int, Callable[[], bytes]] | None = None
    while True:
        unit = claim()
        if unit is not None:
            if not 0 <= unit < units:
                raise ProtocolError(f"claimed encryption unit {unit} of {units}")
            started = (unit, pool.encrypt_later(plaintexts(unit)))
        if ahead is not None:
            yield ahead[0], ahead[1]()
        if unit is None:
            return
        ahead = started


# ---- helper processes ---------------------------------------------------------------------
_POOLS: OrderedDict[tuple[str, bytes], tuple[PrivateKey, KeyHolderPool]] = OrderedDict()
"""This helper's crypto processes, by (job, modulus): at most ``KEPT_KEYS`` jobs' keys."""


def _pool_for(ctx: StepContext, task: CryptoShard) -> tuple[PrivateKey, KeyHolderPool]:
    private = open_key(ctx, task.n, task.key)  # every shard's key is checked, also when kept
    ident = (ctx.job, task.n)
    kept = _POOLS.get(ident)
    if kept is not None and (kept[0].p, kept[0].q) == (private.p, private.q):
        _POOLS.move_to_end(ident)
        return kept
    if kept is not None:
        _POOLS.pop(ident)[1].close()
    while len(_POOLS) >= KEPT_KEYS:
        _POOLS.popitem(last=False)[1][1].close()
    processes = ctx.party.crypto_processes or None
    _POOLS[ident] = private, KeyHolderPool(private, processes, on_start=die_with_parent)
    return _POOLS[ident]


def forget_job(job: str) -> None:
    """Stop the crypto processes of a job and drop its key from this process."""
    for ident in [i for i in _POOLS if i[0] == job]:
        _POOLS.pop(ident)[1].close()


def crypto_shard(ctx: StepContext, task: CryptoShard) -> None:
    """Work step (a helper process of the active party): do the units it can claim, and send
    each one's result to the coordinating process as soon as it is done."""
    if task.op not in OPS or not 0 < len(task.n) <= MAX_KEY_BYTES or task.unit < 1 \
            or task.count < 2:
        raise ProtocolError(f"crypto shard: operation {task.op!r}, key size, unit or count out "
                            f"of range")
    private, pool = _pool_for(ctx, task)
    public = private.public_key
    width = task.width if task.op == "encrypt" else public.ciphertext_bytes
    if task.op == "fold" and not 1 <= task.cell_bits < len(task.n) * 8:
        raise ProtocolError(f"crypto shard: bin sums of {task.cell_bits} bits")
    if task.op == "encrypt" and not 1 <= task.width <= len(task.n):
        raise ProtocolError(f"crypto shard: plaintexts of {task.width} bytes")
    try:
        values = decrypt_body(_key(ctx), task.data, _bound("data", ctx.job, task.claims,
                                                          task.op, task.tree, task.depth))
    except DecodeError:
        raise ProtocolError("crypto shard: its inputs are not sealed by this party for this "
                            "step: refused") from None
    if len(values) != task.count * width:
        raise ProtocolError(f"crypto shard: {len(values)} bytes for {task.count} values of "
                            f"{width} bytes")
    units = -(-task.count // task.unit)
    log.info("%s job=%s t%d d%d: taking %s units of %d", ctx.party.name, ctx.job, task.tree,
             task.depth, task.op, units)
    done, started = 0, time.perf_counter()

    def values_of(unit: int) -> bytes:
        return values[unit * task.unit * width:min((unit + 1) * task.unit, task.count) * width]

    def answer(unit: int, result: bytes) -> None:
        nonlocal done, started
        ctx.send(ctx.party.name, MsgType.CRYPTO_UNIT, CryptoUnit(
            task.tree, task.depth, task.claims, unit, result, time.perf_counter() - started))
        done, started = done + 1, time.perf_counter()

    claim = lambda: ctx.claim(task.claims)  # noqa: E731
    if task.op == "encrypt":
        for unit, result in encrypt_claimed(pool, claim, units,
                                            lambda u: from_bytes(values_of(u), width)):
            answer(unit, result)
        if ctx.party.make_ahead:  # the next tree's share, on idle CPU
            pool.prepare(done * task.unit)
    else:
        while (claimed := claim()) is not None:
            if not 0 <= claimed < units:
                raise ProtocolError(f"claimed decryption unit {claimed} of {units}")
            inputs = values_of(claimed)
            plain = to_bytes(pool.decrypt_sums(inputs, task.cell_bits) if task.op == "fold"
                             else pool.decrypt(inputs), len(task.n))
            answer(claimed, encrypt_body(_key(ctx), plain,
                                         _bound("result", ctx.job, task.claims, claimed)))
    log.debug("%s t%d d%d: %s: %d units done here", ctx.party.name, task.tree, task.depth,
              task.op, done)
