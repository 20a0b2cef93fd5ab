"""The active party's encryption and decryption shards: its helper processes get the job's key
only sealed by the party, refuse anything else, and their units are checked before use."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from crypto.paillier import PaillierPrivateKey, ciphertexts_from_bytes, generate_keypair
from messages.bodies import ErrorReply
from messages.secureboost import CryptoShard, CryptoUnit
from messages.envelope import Envelope, MsgType
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from workers import ProtocolError
from workers.crypto_shards import (SharedCrypto, forget_job, from_bytes, hand_out, open_key,
                                   seal_key, take_units, to_bytes)
from tests.scenarios import TEST_POLICY
from workers.handlers import StepContext
from workers.mailbox import Mailbox
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

SEALERS = federation_sealers(["guest", "host"])
PUBLIC, PRIVATE = generate_keypair(1024)


def _party(tmp_path: Path, name: str = "guest") -> PartySpec:
    return PartySpec(name, "active", "", "id", "y", str(tmp_path), policy=TEST_POLICY,
                     crypto_processes=1)


def _ctx(tmp_path: Path, hub: MemoryHub, sealer: str = "guest", job: str = "job") -> StepContext:
    """The coordinating process's view of a step of ``job`` (signing as ``sealer``)."""
    return StepContext(_party(tmp_path, sealer), job, "s1/encrypt_gradients/t0/d-1", None,
                       Mailbox(), lambda *_: None, hub.endpoint(sealer), SEALERS[sealer])


@pytest.fixture
def hub() -> Iterator[MemoryHub]:
    yield MemoryHub(["guest", "host", "flow"], helpers={"guest": 1, "host": 1})
    forget_job("job")


def test_the_key_opens_only_for_the_party_and_job_it_was_sealed_for(tmp_path: Path,
                                                                    hub: MemoryHub) -> None:
    ctx = _ctx(tmp_path, hub)
    sealed = seal_key(ctx, PRIVATE)
    assert str(PRIVATE.p) not in repr(sealed) and int(PRIVATE.p).to_bytes(64, "big") not in sealed
    opened = open_key(ctx, PUBLIC.n_bytes, sealed)
    assert (opened.p, opened.q, opened.obfuscator) == (PRIVATE.p, PRIVATE.q, PRIVATE.obfuscator)
    refused = "not sealed by this party"
    with pytest.raises(ProtocolError, match=refused):  # another job of the same party
        open_key(_ctx(tmp_path, hub, job="other"), PUBLIC.n_bytes, sealed)
    with pytest.raises(ProtocolError, match=refused):  # another modulus
        open_key(ctx, generate_keypair(1024)[0].n_bytes, sealed)
    with pytest.raises(ProtocolError, match=refused):  # sealed by another party's key
        open_key(ctx, PUBLIC.n_bytes, seal_key(_ctx(tmp_path, hub, "host"), PRIVATE))
    tampered = bytearray(sealed)
    tampered[20] ^= 1
    with pytest.raises(ProtocolError, match=refused):
        open_key(ctx, PUBLIC.n_bytes, bytes(tampered))


def _helper(tmp_path: Path, hub: MemoryHub) -> Worker:
    return Worker(_party(tmp_path), hub.endpoint("guest", helper=True), PROTOCOLS,
                  SEALERS["guest"])


def _next(hub: MemoryHub, name: str = "guest") -> Envelope | None:
    data = hub.endpoint(name).receive(timeout=5)
    return None if data is None else SEALERS[name].open(data)


def test_a_helper_encrypts_and_decrypts_the_units_it_claims(tmp_path: Path,
                                                            hub: MemoryHub) -> None:
    ctx, helper = _ctx(tmp_path, hub), _helper(tmp_path, hub)
    values = [3, 1 << 100, 0, 7, 12345, 99, 5, 1, 2, 4]
    work = hand_out(ctx, "encrypt", 0, -1, seal_key(ctx, PRIVATE), PUBLIC.n_bytes,
                    lambda: to_bytes(values, 13), len(values), 13, 4)
    assert work is not None and work.units == 3
    shard = hub.endpoint("guest", helper=True).receive(timeout=5)
    assert shard is not None
    helper.handle_bytes(shard)  # the helper claims all three units: the coordinator took none
    for unit in range(3):
        env = _next(hub)
        assert env is not None and env.kind == MsgType.CRYPTO_UNIT and env.body.unit == unit
        ctx.mailbox.put((MsgType.CRYPTO_UNIT, "guest", 0, -1), env.body)
    parts = take_units(ctx, work, PUBLIC.ciphertext_bytes)
    assert work.missing() == [] and work.by_helpers == 3
    blob = b"".join(p.result for p in sorted(parts, key=lambda p: p.unit))
    ciphertexts = ciphertexts_from_bytes(blob, PUBLIC)
    assert [int(m) for m in PRIVATE.decrypt_batch(ciphertexts)] == values

    # decryption: the helper's plaintexts come back sealed, and open to the right values
    dctx = StepContext(ctx.party, "job", "s1/find_splits/t0/d1", None, Mailbox(),
                       lambda *_: None, hub.endpoint("guest"), SEALERS["guest"])
    work = hand_out(dctx, "decrypt", 0, 1, seal_key(dctx, PRIVATE), PUBLIC.n_bytes,
                    lambda: blob, len(values), PUBLIC.ciphertext_bytes, 5)
    assert work is not None
    shard = hub.endpoint("guest", helper=True).receive(timeout=5)
    helper.handle_bytes(shard)
    for _ in range(2):
        env = _next(hub)
        assert env is not None and to_bytes([values[0]], 128) not in env.body.result
        dctx.mailbox.put((MsgType.CRYPTO_UNIT, "guest", 0, 1), env.body)
    take_units(dctx, work, len(PUBLIC.n_bytes))
    plain = from_bytes(b"".join(work.done[u] for u in range(work.units)), len(PUBLIC.n_bytes))
    assert plain == values


def test_forged_and_wrongly_sealed_shards_are_refused_and_the_helper_goes_on(
        tmp_path: Path, hub: MemoryHub, caplog: pytest.LogCaptureFixture) -> None:
    ctx, helper = _ctx(tmp_path, hub), _helper(tmp_path, hub)
    host_ctx = _ctx(tmp_path, hub, "host")
    values = list(range(1, 9))
    good = hand_out(ctx, "encrypt", 0, -1, seal_key(ctx, PRIVATE), PUBLIC.n_bytes,
                    lambda: to_bytes(values, 1), len(values), 1, 4)
    assert good is not None
    shard = SEALERS["guest"].open(hub.endpoint("guest", helper=True).receive(timeout=5))
    body: CryptoShard = shard.body

    # work from another party: dropped before any handler
    with caplog.at_level(logging.WARNING, "fedboost.worker"):
        helper.handle_bytes(SEALERS["host"].seal(Envelope("job", shard.task, "host", "guest",
                                                          MsgType.CRYPTO_SHARD, body)))
    assert "rejected CRYPTO_SHARD work from 'host'" in caplog.text
    assert hub.endpoint("guest").receive(timeout=0.5) is None

    # the party's own signature, but a key sealed under another party's key: refused, answered
    wrong = type(body)(**{**_fields(body), "key": seal_key(host_ctx, PRIVATE)})
    helper.handle_bytes(SEALERS["guest"].seal(Envelope("job", shard.task, "guest", "guest",
                                                       MsgType.CRYPTO_SHARD, wrong)))
    reply = _next(hub)
    assert reply is not None and reply.kind == MsgType.ERROR
    assert isinstance(reply.body, ErrorReply) and "not sealed by this party" in reply.body.message

    # inputs sealed for another step (the key is right): refused too
    moved = type(body)(**{**_fields(body), "tree": 5})
    helper.handle_bytes(SEALERS["guest"].seal(Envelope("job", shard.task, "guest", "guest",
                                                       MsgType.CRYPTO_SHARD, moved)))
    reply = _next(hub)
    assert reply is not None and "not sealed by this party for this step" in reply.body.message

    # and the genuine shard is still done
    helper.handle_bytes(SEALERS["guest"].seal(Envelope("job", shard.task, "guest", "guest",
                                                       MsgType.CRYPTO_SHARD, body)))
    units = [_next(hub) for _ in range(2)]
    assert all(u is not None and u.kind == MsgType.CRYPTO_UNIT for u in units)


def _fields(body: CryptoShard) -> dict[str, object]:
    return {name: getattr(body, name) for name in body.__dataclass_fields__}


def test_a_unit_of_the_wrong_size_or_count_is_refused_with_a_clear_error(tmp_path: Path,
                                                                        hub: MemoryHub) -> None:
    ctx = _ctx(tmp_path, hub)
    width = PUBLIC.ciphertext_bytes
    work = SharedCrypto(0, -1, "encrypt", "pool", units=3, unit=4, count=10)
    key = (MsgType.CRYPTO_UNIT, "guest", 0, -1)

    def refused(part: CryptoUnit, why: str) -> None:
        ctx.mailbox.put(key, part)
        with pytest.raises(ProtocolError, match=why):
            take_units(ctx, work, width)

    refused(CryptoUnit(0, -1, "pool", 0, b"\0" * (3 * width), 0.1),
            f"encrypt unit 0: {3 * width} bytes, expected {4 * width}")
    refused(CryptoUnit(0, -1, "pool", 2, b"\0" * (3 * width), 0.1),  # the last unit has 2
            f"expected {2 * width}")
    refused(CryptoUnit(0, -1, "pool", 3, b"", 0.1), "unit 3 of 3 twice or out of range")
    ctx.mailbox.put(key, CryptoUnit(0, -1, "pool", 1, b"\0" * (4 * width), 0.1))
    take_units(ctx, work, width)
    refused(CryptoUnit(0, -1, "pool", 1, b"\0" * (4 * width), 0.1), "unit 1 of 3 twice")
    # a late unit of an earlier try of the step (another pool) is not this step's: ignored
    ctx.mailbox.put(key, CryptoUnit(0, -1, "older", 0, b"", 0.1))
    assert take_units(ctx, work, width) == [] and work.missing() == [0, 2]


def test_the_private_key_prints_no_factor() -> None:
    assert str(int(PRIVATE.p)) not in repr(PRIVATE) and isinstance(PRIVATE, PaillierPrivateKey)


@pytest.mark.parametrize("make_ahead", [True, False])
def test_the_party_decides_whether_obfuscators_are_made_ahead(make_ahead: bool) -> None:
    """A worker's make_ahead (its file, or --no-make-ahead) decides; the active party's state
    follows it and makes none after the last tree."""
    from boosting.params import BoostParams
    from workers.vertical.active_state import ActiveTraining

    run = ActiveTraining(params=BoostParams(n_trees=2), public=PUBLIC, private=PRIVATE,
                         crypto_processes=1, make_ahead=make_ahead)
    try:
        run.prepare_encryption(10, 2)  # after the last tree: none
        assert run.pool is None
        run.prepare_encryption(10, 1)
        assert (run.pool is not None and run.pool._preparers is not None) is make_ahead
    finally:
        run.close()
