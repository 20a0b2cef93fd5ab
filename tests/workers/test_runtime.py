"""The worker loop: bad input gets a clear error reply or is dropped, and the worker goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from messages import MessageError
from messages.bodies import Ack, ErrorReply, PartyInfo, PsiPoints, Step
from messages.secureboost import JobSpec, OpenJob
from messages.envelope import Envelope, Kind, MsgType, encode_envelope
from messages.params import TreeParams
from messages.signing import Sealer, _signed_bytes, federation_sealers
from messages.transport import MemoryHub
from tests.scenarios import DATA, TEST_POLICY
from workers.mailbox import SENDER_MAIL
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker


def _spec(data: Path) -> JobSpec:
    return JobSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
                   TreeParams(n_trees=2, max_depth=3), False, 1024, 0.0, 0, "y")


SEALERS = federation_sealers(["guest", "host"])
"""Real Ed25519 keys of a test federation: the worker is ``host``, commands come from ``flow``."""


def _worker(tmp_path: Path, data: Path) -> tuple[Worker, MemoryHub]:
    hub = MemoryHub(["host", "guest", "flow"])
    party = PartySpec("host", "passive", str(data), "id", None, str(tmp_path),
                      policy=TEST_POLICY)
    return Worker(party, hub.endpoint("host"), PROTOCOLS, SEALERS["host"]), hub


def _command(kind: Kind, body: object, task: str = "t") -> bytes:
    return SEALERS["flow"].seal(Envelope("job", task, "flow", "host", kind, body))


def _reply(hub: MemoryHub) -> Envelope:
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None
    return SEALERS["flow"].open(data)


def test_garbage_and_misaddressed_messages_are_dropped(tmp_path: Path) -> None:
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    worker.handle_bytes(b"\x93\x01\x02")
    worker.handle_bytes(SEALERS["flow"].seal(Envelope("job", "t", "flow", "guest", MsgType.ACK,
                                                      Ack())))
    assert hub.endpoint("flow").receive(timeout=0.2) is None
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA))))
    reply = _reply(hub)
    assert reply.kind == MsgType.OPENED and reply.body.rows == 569 and not reply.body.checkpoints


def test_bad_data_and_wrong_steps_get_error_replies(tmp_path: Path) -> None:
    bad = tmp_path / "host.csv"
    bad.write_text("id,x0\n1,2\n1,3\n")
    worker, hub = _worker(tmp_path, bad)
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(bad))))
    reply = _reply(hub)
    assert isinstance(reply.body, ErrorReply) and reply.body.user_error
    assert "duplicate id at rows 2 and 3" in reply.body.message and str(bad) in reply.body.message
    assert "'1'" not in reply.body.message  # the id itself stays at the party
    worker.handle_bytes(_command(MsgType.FIND_BEST_SPLITS, Step(0, 0), "t2"))
    reply = _reply(hub)
    assert isinstance(reply.body, ErrorReply) and "no step FIND_BEST_SPLITS" in reply.body.message
    worker.handle_bytes(_command(MsgType.APPLY_SPLITS, Step(0, 0), "t3"))  # no job state yet
    reply = _reply(hub)
    assert isinstance(reply.body, ErrorReply) and not reply.body.user_error


def test_a_step_waiting_for_a_peer_times_out_naming_it(tmp_path: Path) -> None:
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    worker.peer_timeout = 0.0
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA))))
    _reply(hub)
    worker.handle_bytes(_command(MsgType.PSI_BLIND, Step(), "b"))
    _reply(hub)
    worker.handle_bytes(_command(MsgType.PSI_REBLIND, Step(), "r"))
    assert hub.endpoint("flow").receive(timeout=0.2) is None
    worker._expire_pending()
    reply = _reply(hub)
    assert isinstance(reply.body, ErrorReply) and "PSI_POINTS from guest" in reply.body.message


def _hand_sealed(sealer: Sealer, env: Envelope, sent_at: float | None = None) -> bytes:
    """A correctly signed message that ``Sealer.seal`` would refuse to make (another sender,
    another time)."""
    nonce, when, body = os.urandom(16), time.time() if sent_at is None else sent_at, \
        encode_envelope(env)
    signature = Ed25519PrivateKey.from_private_bytes(sealer.private).sign(
        _signed_bytes(sealer.identity, nonce, when, body))
    return msgpack.packb({"v": 1, "signer": sealer.identity, "nonce": nonce, "sent_at": when,
                          "envelope": body, "signature": signature})


def test_forged_tampered_and_replayed_messages_are_rejected(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    flow = hub.endpoint("flow")
    opened = _command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s1/open")
    worker.handle_bytes(opened)
    assert _reply(hub).kind == MsgType.OPENED

    def rejected(data: bytes, why: str) -> None:
        caplog.clear()
        worker.handle_bytes(data)
        assert flow.receive(timeout=0.1) is None, why
        assert why in caplog.text

    rejected(opened, "replayed message")  # the same bytes again
    blind = Envelope("job", "s1/psi", "flow", "host", MsgType.PSI_BLIND, Step())
    other_flow = federation_sealers(["guest", "host"])["flow"]  # valid format, wrong key
    rejected(other_flow.seal(blind), "bad signature")
    frame = msgpack.unpackb(SEALERS["flow"].seal(blind))
    frame["envelope"] = frame["envelope"].replace(b"s1/psi", b"s1/psj")  # signature intact
    rejected(msgpack.packb(frame), "bad signature")
    rejected(SEALERS["guest"].seal(Envelope("job", "s1/psi", "guest", "host", MsgType.PSI_BLIND,
                                            Step())), "commands come from flows")
    stranger = federation_sealers(["mallory"])["mallory"]
    rejected(stranger.seal(Envelope("job", "s1/psi", "mallory", "host", MsgType.PSI_BLIND,
                                    Step())), "signed by 'mallory': no public key")
    rejected(_hand_sealed(SEALERS["guest"], blind), "from 'flow' signed by 'guest'")
    rejected(_hand_sealed(SEALERS["flow"], blind, sent_at=time.time() - 2 * 24 * 3600),
             "replayed, or clocks apart")
    worker.handle_bytes(SEALERS["flow"].seal(blind))  # the worker goes on serving
    assert _reply(hub).kind == MsgType.ACK
    rejected(SEALERS["flow"].seal(blind), "replayed PSI_BLIND")  # fresh nonce, task id done
    with pytest.raises(MessageError, match="cannot sign as"):
        SEALERS["guest"].seal(Envelope("job", "s1/x", "host", "guest", MsgType.ACK, Ack()))


def test_an_idle_job_is_dropped_and_a_later_step_reports_the_lost_state(tmp_path: Path) -> None:
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s1/open"))
    assert _reply(hub).kind == MsgType.OPENED
    worker._drop_idle_jobs()
    assert "job" in worker.jobs  # just used: kept
    worker.idle_job_seconds = 0.0
    worker._drop_idle_jobs()
    assert not worker.jobs
    worker.handle_bytes(_command(MsgType.PSI_BLIND, Step(), "s1/psi"))
    reply = _reply(hub).body
    assert isinstance(reply, ErrorReply) and reply.state_lost and "not open here" in reply.message


def test_replayed_open_and_close_after_a_restart_are_refused_and_delete_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 12 item 4: a finished session's OPEN_JOB and CLOSE_JOB, replayed verbatim after
    the worker restarted, would reopen the job and delete the newer session's checkpoints."""
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    captured = [_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s1/open"),
                _command(MsgType.CLOSE_JOB, Step(), "s1/close")]
    for data in captured:
        worker.handle_bytes(data)
        assert not isinstance(_reply(hub).body, ErrorReply)
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s2/open"))
    assert _reply(hub).kind == MsgType.OPENED
    planted = tmp_path / "checkpoints" / "trees-000001.ckpt"  # session s2's progress
    planted.parent.mkdir()
    planted.write_bytes(b"state")
    # a CLOSE_JOB of another session, or for a job not open here, closes nothing
    worker.handle_bytes(_command(MsgType.CLOSE_JOB, Step(), "s9/close"))
    assert "superseded" in _reply(hub).body.message
    other = SEALERS["flow"].seal(Envelope("other", "s2/close", "flow", "host", MsgType.CLOSE_JOB,
                                          Step()))
    worker.handle_bytes(other)
    assert _reply(hub).body.state_lost and planted.exists() and "job" in worker.jobs

    host = SEALERS["host"]  # the restarted worker: same keys and folder, no nonces in memory
    restarted = Worker(worker.party, hub.endpoint("host"), PROTOCOLS,
                       Sealer(host.identity, host.private, dict(host.trusted)))
    for data in captured:
        caplog.clear()
        restarted.handle_bytes(data)
        assert "rejected replayed" in caplog.text and "answered before" in caplog.text
        refused = _reply(hub).body  # to the flow that signed it; a stale task id to any flow
        assert isinstance(refused, ErrorReply) and "answered before" in refused.message
    assert planted.exists() and not restarted.jobs
    restarted.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s3/open"))
    assert _reply(hub).kind == MsgType.OPENED  # a fresh session is served


def test_a_worker_killed_between_its_answer_and_the_reply_tells_the_flow(
        tmp_path: Path) -> None:
    """An answer goes on record before its reply is published: a worker killed in between
    gets the unacknowledged command again after its restart. It must not answer it twice, nor
    stay silent (the flow would wait its whole step timeout): the flow hears the state is lost
    and resumes from the checkpoints."""
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    opener = _command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s1/open")
    worker.handle_bytes(opener)
    assert _reply(hub).kind == MsgType.OPENED
    step = _command(MsgType.PSI_BLIND, Step(), "s1/psi")
    worker.handle_bytes(step)
    _reply(hub)  # the reply that never left the killed process

    host = SEALERS["host"]
    restarted = Worker(worker.party, hub.endpoint("host"), PROTOCOLS,
                       Sealer(host.identity, host.private, dict(host.trusted)))
    restarted.handle_bytes(step)  # the broker redelivers what was never acknowledged
    reply = _reply(hub)
    assert reply.task == "s1/psi" and reply.kind == MsgType.ERROR
    assert reply.body.state_lost and "reply may have been lost" in reply.body.message
    assert not restarted.jobs and hub.endpoint("flow").receive(timeout=0.2) is None


def test_a_flooding_peer_is_capped_per_sender_and_job(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Issue 12 item 11: peer mailboxes are bounded in messages and bytes; what is over the
    limit is dropped with a warning naming the sender and the job, and nothing else suffers."""
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA)), "s1/open"))
    assert _reply(hub).kind == MsgType.OPENED
    mailbox = worker.jobs["job"].mailbox
    limit = SENDER_MAIL[0]

    def positions(tree: int, sender: str = "guest", pad: int = 0) -> bytes:
        return SEALERS[sender].seal(Envelope("job", "s1/x", sender, "host", MsgType.PSI_POINTS,
                                             PsiPoints(tree, b"\0" * pad)))

    for k in range(limit + 3):  # every one a validly signed message of the job's active party
        worker.handle_bytes(positions(k))
    assert sum(len(v) for v in mailbox.items.values()) == limit
    assert caplog.text.count("dropped PSI_POINTS from 'guest' of job 'job': mailbox full") == 3
    mailbox.take_all(MsgType.PSI_POINTS, "guest", -1, 0)  # taken by a step: room again
    worker.handle_bytes(positions(limit + 5))
    assert mailbox.held["guest"][0] == limit  # limit - 1 left, one more filed
    mailbox.sender_limit, mailbox.job_limit = (10, 1 << 30), (100, 40_000)
    mailbox.drop_tree(-1)
    caplog.clear()
    worker.handle_bytes(positions(1, pad=30_000))
    worker.handle_bytes(positions(2, pad=30_000))  # over the job's bytes
    assert "of the job wait" in caplog.text and mailbox.held["guest"][0] == 1


def test_a_worker_stopped_mid_job_names_the_jobs_it_leaves(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Ctrl-C or SIGTERM of a worker with a job open: one line saying which, instead of a
    silent exit while the flow waits."""
    worker, hub = _worker(tmp_path, DATA / "breast_hetero_host.csv")
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(DATA))))
    assert _reply(hub).kind == MsgType.OPENED
    worker.stop()
    with caplog.at_level("WARNING", logger="fedboost.worker"):
        worker.serve()
    lines = [r.getMessage() for r in caplog.records if "unfinished" in r.getMessage()]
    assert lines == ["worker host stops with 1 job(s) unfinished: job; its checkpoints stay, "
                     "and a worker started again resumes them when their flow asks"]
