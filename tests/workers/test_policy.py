"""A party's own policy: a job asking for a smaller key (or another protocol) is refused with one
line naming the party, what was asked and what is allowed, and the worker goes on serving."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto.paillier import generate_keypair
from fedboost.worker import policy_of
from flows.config import PolicyConfig
from messages.bodies import AlignedRows, ErrorReply, PartyInfo, Step
from messages.secureboost import JobSpec, OpenJob, PublicKeyMsg
from messages.envelope import Envelope, Kind, MsgType
from messages.instance_space import encode_mask
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from messages.params import TreeParams
from messages.policy import OBFUSCATORS, PREDICT_MODES, ROLES
from tests.scenarios import DATA, TEST_POLICY
from workers.embedded import start_workers, stop_workers
from workers.party import PartySpec
from workers.policy import MIN_KEY_BITS, PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

SEALERS = federation_sealers(["guest", "host"])
SPEC = JobSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
               TreeParams(n_trees=1, max_depth=2), False, 1024, 0.0, 0, "y")


def _command(to: str, kind: Kind, body: object, task: str) -> bytes:
    return SEALERS["flow"].seal(Envelope("job", f"s/{task}", "flow", to, kind, body))


def _reply(hub: MemoryHub) -> Envelope:
    data = hub.endpoint("flow").receive(timeout=60)
    assert data is not None, "the worker did not answer"
    return SEALERS["flow"].open(data)


def test_the_active_worker_refuses_a_key_below_its_policy_and_goes_on_serving(
        tmp_path: Path) -> None:
    """A real worker process with a 1024-bit minimum gets a job asking 512 bits, then 1024."""
    hub = MemoryHub(["guest", "host", "flow"])
    guest = PartySpec("guest", "active", str(DATA / "breast_hetero_guest.csv"), "id", "y",
                      str(tmp_path / "guest"), policy=TEST_POLICY)
    procs, _ = start_workers(hub, [guest], SEALERS)
    flow = hub.endpoint("flow")
    try:
        flow.send("guest", _command("guest", MsgType.OPEN_JOB,
                                    OpenJob(replace(SPEC, key_bits=512)), "open-512"))
        refused = _reply(hub)
        assert isinstance(refused.body, ErrorReply)
        assert refused.body.message == ("party guest refuses a 512-bit Paillier key (the job asks "
                                        "for): its policy requires at least 1024 bits")
        assert "\n" not in refused.body.message
        flow.send("guest", _command("guest", MsgType.OPEN_JOB, OpenJob(SPEC), "open-1024"))
        opened = _reply(hub)
        assert opened.kind == MsgType.OPENED and opened.body.rows == 569
        flow.send("guest", _command("guest", MsgType.CLOSE_JOB, Step(), "close"))
        assert _reply(hub).kind == MsgType.ACK
        procs[0].join(30)
        assert procs[0].exitcode == 0  # served the job to its end
    finally:
        stop_workers(procs)


def test_the_default_policy_needs_2048_bits_and_refuses_other_protocols(tmp_path: Path) -> None:
    assert PartyPolicy().min_key_bits == MIN_KEY_BITS == 2048
    assert policy_of(PolicyConfig()) == PartyPolicy()  # a worker file without 'policy:'
    hub = MemoryHub(["guest", "host", "flow"])
    guest = PartySpec("guest", "active", str(DATA / "breast_hetero_guest.csv"), "id", "y",
                      str(tmp_path))  # the default policy
    worker = Worker(guest, hub.endpoint("guest"), PROTOCOLS, SEALERS["guest"])
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(SPEC), "open"))
    assert _reply(hub).body.message == ("party guest refuses a 1024-bit Paillier key (the job "
                                        "asks for): its policy requires at least 2048 bits")
    worker.party = replace(guest, policy=PartyPolicy(min_key_bits=1024, protocols=("simfl",)))
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(SPEC), "open-again"))
    assert _reply(hub).body.message == ("party guest refuses protocol 'vertical_secureboost': its "
                                        "policy allows simfl")
    assert worker.jobs["job"].state is None  # nothing was loaded or generated
    worker.party = replace(guest, policy=PartyPolicy(min_key_bits=1024, obfuscator="full"))
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(SPEC), "open-full"))
    assert _reply(hub).kind == MsgType.OPENED
    assert worker.jobs["job"].state.role_state.private.obfuscator == "full"  # the policy's


def test_a_passive_party_refuses_a_public_key_below_its_policy_whatever_the_spec_claims(
        tmp_path: Path) -> None:
    hub = MemoryHub(["guest", "host", "flow"])
    host = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                     str(tmp_path), policy=TEST_POLICY)
    worker = Worker(host, hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
    worker.handle_bytes(_command("host", MsgType.OPEN_JOB, OpenJob(SPEC), "open"))
    assert _reply(hub).kind == MsgType.OPENED  # the spec claims 1024 bits: allowed
    public, _ = generate_keypair(512)  # the active party sends a smaller key anyway
    for kind, body in ((MsgType.PUBLIC_KEY, PublicKeyMsg(public.n_bytes, 1024)),
                       (MsgType.ALIGNED_ROWS, AlignedRows(
                           np.arange(569, dtype="<i4").tobytes(),
                           encode_mask(np.zeros(569, dtype=bool))))):
        worker.handle_bytes(SEALERS["guest"].seal(Envelope("job", "s/psi", "guest", "host",
                                                           kind, body)))
    worker.handle_bytes(_command("host", MsgType.BIN_FEATURES, Step(), "bin"))
    refused = _reply(hub)
    assert isinstance(refused.body, ErrorReply)
    assert refused.body.message == ("party host refuses a 512-bit Paillier key (the public key "
                                    "guest sent): its policy requires at least 1024 bits")
    assert worker.jobs["job"].state.role_state.public is None
    worker.handle_bytes(_command("host", MsgType.CLOSE_JOB, Step(), "close"))
    assert _reply(hub).kind == MsgType.ACK  # still serving


def test_job_files_cannot_ask_for_less_than_1024_bits() -> None:
    import pytest

    from flows.config import ConfigError
    from tests.scenarios import config_with

    with pytest.raises(ConfigError, match="key 'crypto.key_bits': Input should be greater than "
                                          "or equal to 1024"):
        config_with("breast.yaml", crypto={"key_bits": 512})


def test_a_role_the_policy_does_not_allow_for_the_protocol_is_refused(tmp_path: Path) -> None:
    """A worker serving every protocol still takes only the roles its policy names for each."""
    guest = PartySpec("guest", "", str(DATA / "breast_hetero_guest.csv"), "id", "y",
                      str(tmp_path / "guest"),
                      policy=PartyPolicy(min_key_bits=1024, roles={"vertical_secureboost":
                                                                   ("passive",)}))
    hub = MemoryHub(["guest", "flow"])
    worker = Worker(guest, hub.endpoint("guest"), PROTOCOLS, SEALERS["guest"])
    worker.handle_bytes(SEALERS["flow"].seal(
        Envelope("job", "s/open", "flow", "guest", MsgType.OPEN_JOB, OpenJob(SPEC))))
    reply = _reply(hub)
    assert reply.kind == MsgType.ERROR and reply.body.user_error
    assert reply.body.message == ("party guest: the job gives it role 'active' in "
                                  "vertical_secureboost; its policy allows passive")
    assert "job" not in worker.jobs  # nothing opened; the worker goes on serving


def test_each_scheme_has_its_own_floor_and_a_policy_can_refuse_a_scheme(tmp_path: Path) -> None:
    """Okamoto-Uchiyama (crypto.scheme: ou): a job cannot get under the party's OU floor by
    naming the scheme, and a party that lists only Paillier refuses it; a worker file says so
    with ``schemes`` and ``min_ou_key_bits``."""
    hub = MemoryHub(["guest", "host", "flow"])
    guest = PartySpec("guest", "active", str(DATA / "breast_hetero_guest.csv"), "id", "y",
                      str(tmp_path), policy=PartyPolicy(min_key_bits=1024))  # OU floor: 2048
    worker = Worker(guest, hub.endpoint("guest"), PROTOCOLS, SEALERS["guest"])
    ou_spec = replace(SPEC, scheme="ou")
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(ou_spec), "open-ou"))
    assert _reply(hub).body.message == ("party guest refuses a 1024-bit Okamoto-Uchiyama key "
                                        "(the job asks for): its policy requires at least 2048 "
                                        "bits")
    only_paillier = policy_of(PolicyConfig(min_key_bits=1024, min_ou_key_bits=1024,
                                           schemes=["paillier"]))
    worker.party = replace(guest, policy=only_paillier)
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(ou_spec), "open-ou-2"))
    assert _reply(hub).body.message == ("party guest refuses Okamoto-Uchiyama encryption (the "
                                        "job asks for): its policy allows paillier")
    assert worker.jobs["job"].state is None  # nothing was loaded or generated
    worker.party = replace(guest, policy=TEST_POLICY)
    worker.handle_bytes(_command("guest", MsgType.OPEN_JOB, OpenJob(ou_spec), "open-ou-3"))
    assert _reply(hub).kind == MsgType.OPENED
    run = worker.jobs["job"].state.role_state
    assert run.public.scheme == "ou" and run.public.n.bit_length() == 1024
    assert run.private.p ** 2 * run.private.q == run.public.n


def test_a_passive_party_reads_the_key_as_the_job_names_it_and_checks_that_schemes_floor(
        tmp_path: Path) -> None:
    from crypto.ou import generate_keypair as ou_keypair

    hub = MemoryHub(["guest", "host", "flow"])
    host = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                     str(tmp_path), policy=replace(TEST_POLICY, min_ou_key_bits=1536))
    worker = Worker(host, hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
    spec = replace(SPEC, scheme="ou", key_bits=1536)
    worker.handle_bytes(_command("host", MsgType.OPEN_JOB, OpenJob(spec), "open"))
    assert _reply(hub).kind == MsgType.OPENED
    public, _ = ou_keypair(1024)  # smaller than the spec and the floor
    for kind, body in ((MsgType.PUBLIC_KEY, PublicKeyMsg(public.n_bytes, 1536)),
                       (MsgType.ALIGNED_ROWS, AlignedRows(
                           np.arange(569, dtype="<i4").tobytes(),
                           encode_mask(np.zeros(569, dtype=bool))))):
        worker.handle_bytes(SEALERS["guest"].seal(Envelope("job", "s/psi", "guest", "host",
                                                           kind, body)))
    worker.handle_bytes(_command("host", MsgType.BIN_FEATURES, Step(), "bin"))
    assert _reply(hub).body.message == ("party host refuses a 1024-bit Okamoto-Uchiyama key (the "
                                        "public key guest sent): its policy requires at least "
                                        "1536 bits")
    assert worker.jobs["job"].state.role_state.public is None


@settings(max_examples=60, deadline=None)
@given(policy=st.builds(
    PartyPolicy, min_key_bits=st.integers(1024, 8192),
    protocols=st.lists(st.sampled_from(sorted(PROTOCOLS)), min_size=1, unique=True).map(tuple),
    obfuscator=st.sampled_from(OBFUSCATORS),
    predict_modes=st.lists(st.sampled_from(PREDICT_MODES), unique=True).map(tuple),
    roles=st.dictionaries(st.sampled_from(sorted(PROTOCOLS)),
                          st.lists(st.sampled_from(ROLES), min_size=1).map(tuple)),
    horizontal_min_members=st.integers(2, 1000),
    fixed_noise_seed=st.sampled_from(["refuse", "allow"])))
def test_a_policy_file_holds_every_setting_of_the_policy_and_nothing_else(
        policy: PartyPolicy) -> None:
    """The ``policy:`` schema is made from ``PartyPolicy`` (declared once, in
    ``messages.policy``): any policy a worker can hold is a policy file, read back whole."""
    assert policy_of(PolicyConfig.model_validate(asdict(policy))) == policy


def test_a_policy_out_of_its_bounds_is_refused_where_it_is_made() -> None:
    for bad in ({"min_key_bits": 512}, {"schemes": ("paillier", "rsa")},
                {"roles": {"horizontal": ("boss",)}}, {"horizontal_member_sets": "maybe"}):
        with pytest.raises(ValueError, match=f"invalid parameter {next(iter(bad))}"):
            PartyPolicy(**bad)  # type: ignore[arg-type]
