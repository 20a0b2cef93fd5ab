"""End-to-end encrypted bodies (``signing.end_to_end``): what the broker sees, who can read it."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boosting.tree import load_model
from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from flows.config import SigningConfig
from messages import DecodeError
from messages.bodies import Step
from messages.e2e import decrypt_body, encrypt_body, pair_key
from messages.envelope import Envelope, MsgType
from messages.signing import ForgedMessage, Sealer, federation_sealers
from messages.transport import MemoryHub
from tests.scenarios import config_with

SEALERS = federation_sealers(["guest", "host", "other"], end_to_end=True)


def _env(sender: str, recipient: str, task: str = "s/marker-step") -> Envelope:
    return Envelope(job="job-1", task=task, sender=sender, recipient=recipient,
                    kind=MsgType.BUILD_HISTOGRAMS, body=Step(3, 2))


def test_pair_keys_agree_from_both_ends_and_differ_per_pair() -> None:
    guest, host, other = SEALERS["guest"], SEALERS["host"], SEALERS["other"]
    assert guest._pair_key("host") == host._pair_key("guest")
    assert guest._pair_key("host") != guest._pair_key("other")
    assert guest._pair_key("other") == other._pair_key("guest")
    assert host._pair_key("other") not in (guest._pair_key("host"), guest._pair_key("other"))
    assert pair_key(guest.private, "guest", host.trusted["host"], "host") == host._pair_key("guest")


@settings(max_examples=50, deadline=None)
@given(body=st.binary(max_size=4096), associated=st.binary(max_size=64), flip=st.integers(0, 10**6))
def test_body_round_trips_and_any_changed_byte_is_refused(body: bytes, associated: bytes,
                                                          flip: int) -> None:
    key = SEALERS["guest"]._pair_key("host")
    sealed = encrypt_body(key, body, associated)
    assert decrypt_body(key, sealed, associated) == body
    tampered = bytearray(sealed)
    tampered[flip % len(sealed)] ^= 0x01
    with pytest.raises(DecodeError):
        decrypt_body(key, bytes(tampered), associated)
    with pytest.raises(DecodeError):
        decrypt_body(key, sealed, associated + b"x")


def test_only_the_recipient_reads_an_encrypted_message() -> None:
    data = SEALERS["flow"].seal(_env("flow.job-1.ab12", "host"))
    raw = msgpack.unpackb(data)
    assert raw["v"] == 2 and raw["to"] == "host"
    assert b"marker-step" not in data and b"job-1" not in data  # the envelope is not readable
    env = SEALERS["host"].open(data)
    assert env.task == "s/marker-step" and env.body == Step(3, 2)
    with pytest.raises(ForgedMessage, match="encrypted for 'host'"):
        SEALERS["other"].open(data)


def test_a_party_that_requires_encryption_refuses_plain_messages() -> None:
    plain = Sealer("guest", SEALERS["guest"].private, SEALERS["guest"].trusted)
    with pytest.raises(ForgedMessage, match="not end-to-end encrypted"):
        SEALERS["host"].open(plain.seal(_env("guest", "host")))
    # a party that does not require it still reads encrypted ones
    lenient = Sealer("host", SEALERS["host"].private, SEALERS["host"].trusted)
    assert lenient.open(SEALERS["guest"].seal(_env("guest", "host"))).body == Step(3, 2)


def test_the_recipient_named_in_the_seal_is_signed() -> None:
    raw = msgpack.unpackb(SEALERS["guest"].seal(_env("guest", "host")))
    raw["to"] = "other"  # redirect to a party that could then try its own key
    with pytest.raises(ForgedMessage, match="bad signature"):
        SEALERS["other"].open(msgpack.packb(raw))


@pytest.mark.usefixtures("prefect_harness")
# the sealing does not depend on the scheme: OU in make test-all
@pytest.mark.parametrize("scheme", ["paillier", pytest.param("ou", marks=pytest.mark.heavy)])
def test_training_with_end_to_end_bodies_gives_the_same_model(tmp_path: Path, scheme: str) -> None:
    plain_config = config_with("breast.yaml", crypto={"key_bits": 1024, "scheme": scheme},
                               params={"n_trees": 3})
    config = plain_config.model_copy(update={"signing": SigningConfig(key_dir=tmp_path,
                                                                      end_to_end=True)})
    hub = MemoryHub(["guest", "host", FLOW_ENDPOINT], record=True, helpers={"host": 1})
    train_embedded(config, tmp_path / "e2e", hub=hub)
    recorded = hub.recorded()
    assert len(recorded) > 50
    assert all(msgpack.unpackb(data)["v"] == 2 for _, _, data in recorded), \
        "a message crossed the transport without end-to-end encryption"
    train_embedded(plain_config, tmp_path / "plain")
    assert load_model(tmp_path / "e2e" / "guest" / "model.json").trees == \
        load_model(tmp_path / "plain" / "guest" / "model.json").trees


def test_a_partys_own_key_is_derived_only_from_its_signing_key() -> None:
    """What a party's processes seal to one another under (the active party's Paillier key on
    its way to its helpers): the same in every process holding ``guest.key``, another for each
    purpose, and neither any pair key nor any other identity's own key."""
    guest, host = SEALERS["guest"], SEALERS["host"]
    copy = Sealer("guest", guest.private, dict(guest.trusted))  # another process of the party
    key = guest.own_key(b"purpose")
    assert copy.own_key(b"purpose") == key and len(key) == 32
    assert guest.own_key(b"another purpose") != key
    assert host.own_key(b"purpose") != key
    assert key not in {guest._pair_key("host"), guest._pair_key("other"),
                       pair_key(guest.private, "guest", guest.trusted["guest"], "guest")}
    sealed = encrypt_body(key, b"secret", b"bound")
    with pytest.raises(DecodeError):
        decrypt_body(host.own_key(b"purpose"), sealed, b"bound")
    assert decrypt_body(copy.own_key(b"purpose"), sealed, b"bound") == b"secret"
