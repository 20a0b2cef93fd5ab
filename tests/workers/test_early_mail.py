"""Peer messages that arrive before their job's opener are kept, bounded, and handed to the job
when it opens, through every check of a message that comes after it (issue 23 item 7)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from messages.bodies import PartyInfo, PsiPoints, Step
from messages.secureboost import JobSpec, OpenJob
from messages.envelope import Envelope, MsgType
from messages.horizontal import MaskPublicKey
from messages.rejections import RejectionLog
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from messages.params import TreeParams
from tests.scenarios import DATA, TEST_POLICY
from workers.column_partitioned.alignment import STAGE_ACTIVE_IDS
from workers.early_mail import EarlyMail
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

SEALERS = federation_sealers(["guest", "host", "other"])
"""The worker is ``host``; ``guest`` is its job's active party, ``other`` a federation party
that is not in the job."""


def _points(sender: str, session: str = "s1", job: str = "job", stage: int = 0,
            pad: int = 0) -> Envelope:
    return Envelope(job, f"{session}/psi", sender, "host", MsgType.PSI_POINTS,
                    PsiPoints(stage, b"\1" * pad))


def _mail(**limits: object) -> EarlyMail:
    return EarlyMail("host", RejectionLog(logging.getLogger("test.early"), "host"),
                     **limits)  # type: ignore[arg-type]


def test_early_mail_is_bounded_per_sender_job_and_in_all() -> None:
    mail = _mail(sender_limit=(3, 1000), job_limit=(5, 10_000), all_limit=(8, 1500))
    for stage in range(3):
        assert mail.hold(_points("guest", stage=stage), "s1", 100, 0.0) is None
    assert "this sender's early mail" in (mail.hold(_points("guest"), "s1", 1, 0.0) or "")
    assert mail.hold(_points("other"), "s1", 100, 0.0) is None
    assert mail.hold(_points("third"), "s1", 100, 0.0) is None
    assert "this job's early mail" in (mail.hold(_points("fourth"), "s2", 1, 0.0) or "")
    assert mail.hold(_points("other", job="j2"), "s1", 100, 0.0) is None
    assert "this sender's" in (mail.hold(_points("other", job="j3"), "s1", 900, 0.0) or "")
    assert mail.hold(_points("third", job="j3"), "s1", 800, 0.0) is None  # 1,400 bytes in all
    assert "every job's" in (mail.hold(_points("x", job="j4"), "s1", 200, 0.0) or "")
    assert len(mail) == 7
    assert [env.sender for env, _ in mail.release("job", "s1")] == ["guest"] * 3 + [
        "other", "third"]
    assert len(mail) == 2 and mail.hold(_points("guest"), "s1", 100, 0.0) is None


def test_early_mail_expires_once_per_sender_and_session() -> None:
    mail = _mail(seconds=10.0)
    mail.hold(_points("guest", stage=0), "s1", 10, 0.0)
    mail.hold(_points("guest", stage=1), "s1", 20, 5.0)
    mail.hold(_points("other"), "s2", 30, 5.0)
    gone = mail.expired(12.0)
    assert [(g.sender, g.session, g.kinds, g.size) for g in gone] == [
        ("guest", "s1", ("PSI_POINTS",), 10)]
    gone = mail.expired(100.0)
    assert sorted((g.sender, g.size) for g in gone) == [("guest", 20), ("other", 30)]
    assert len(mail) == 0 and mail.release("job", "s1") == []


def test_only_peer_mail_of_sessions_never_opened_is_kept() -> None:
    mail = _mail()
    step = Envelope("job", "s1/x", "flow", "host", MsgType.PSI_BLIND, Step())
    own = Envelope("job", "s1/x", "host", "host", MsgType.PSI_POINTS, PsiPoints(0, b""))
    assert not mail.keep(step, "s1", 10, None)  # a command: never early
    assert not mail.keep(own, "s1", 10, None)  # the party's own processes'
    assert not mail.keep(_points("guest"), "s1", 10, "s1")  # its session is open: file it
    mail.opened("job", "s0")
    assert not mail.keep(_points("guest", session="s0"), "s0", 10, "s1")  # stale
    assert not mail.keep(_points("guest", session="s0"), "s0", 10, None)  # closed since
    assert mail.keep(_points("guest"), "s1", 10, None)  # job not open: early
    assert mail.keep(_points("guest", session="s2"), "s2", 10, "s1")  # reopened: early
    assert len(mail) == 2


# ---- in a worker -----------------------------------------------------------------------------

def _spec() -> JobSpec:
    return JobSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
                   TreeParams(n_trees=2, max_depth=3), False, 1024, 0.0, 0, "y")


def _worker(tmp_path: Path) -> tuple[Worker, MemoryHub]:
    hub = MemoryHub(["host", "guest", "other", "flow"])
    party = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                      str(tmp_path), policy=TEST_POLICY)
    return Worker(party, hub.endpoint("host"), PROTOCOLS, SEALERS["host"]), hub


def _open(worker: Worker, hub: MemoryHub, session: str) -> None:
    worker.handle_bytes(SEALERS["flow"].seal(Envelope("job", f"{session}/open", "flow", "host",
                                                      MsgType.OPEN_JOB, OpenJob(_spec()))))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None and SEALERS["flow"].open(data).kind == MsgType.OPENED


def _filed(worker: Worker) -> list[tuple[str, int]]:
    return sorted((key[1], key[3]) for key in worker.jobs["job"].mailbox.items)


def test_a_peer_message_before_the_opener_reaches_the_job(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The race of issue 23 item 7: a peer's message came before this party's opener and was
    dropped ("for unknown job"); the step that needed it waited out its timeout."""
    caplog.set_level(logging.INFO)
    worker, hub = _worker(tmp_path)
    # Execute: the active party's points, and a party not in the job, before the opener
    worker.handle_bytes(SEALERS["guest"].seal(_points("guest", stage=STAGE_ACTIVE_IDS)))
    worker.handle_bytes(SEALERS["other"].seal(_points("other", stage=1)))
    assert "for unknown job" not in caplog.text
    _open(worker, hub, "s1")
    # Assert: filed as if they came after the opener, with the same checks
    assert _filed(worker) == [("guest", STAGE_ACTIVE_IDS)]
    assert "rejected PSI_POINTS from 'other': not a party of job 'job'" in caplog.text
    assert len(worker.early) == 0
    # the step that needs them finds them (before: it waited for PSI_POINTS from guest)
    worker.handle_bytes(SEALERS["flow"].seal(Envelope("job", "s1/reblind", "flow", "host",
                                                      MsgType.PSI_REBLIND, Step())))
    data = hub.endpoint("flow").receive(timeout=5)
    assert data is not None and SEALERS["flow"].open(data).kind == MsgType.ACK


def test_a_reopened_job_keeps_its_new_sessions_mail_and_drops_the_old(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    worker, hub = _worker(tmp_path)
    _open(worker, hub, "s1")
    worker.handle_bytes(SEALERS["guest"].seal(_points("guest", "s2")))  # the next session's
    assert _filed(worker) == [] and len(worker.early) == 1
    _open(worker, hub, "s2")
    assert _filed(worker) == [("guest", 0)]
    caplog.clear()
    worker.handle_bytes(SEALERS["guest"].seal(_points("guest", "s1", stage=1)))  # a late one
    assert "dropped PSI_POINTS of another session" in caplog.text and len(worker.early) == 0


def test_a_restarted_worker_never_hands_an_old_sessions_mail_to_the_new_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted worker forgot the sessions it opened: a late message of one looks early. The
    flow's recovery opens a new session, which must not get it; it expires, logged once."""
    worker, hub = _worker(tmp_path)
    worker.handle_bytes(SEALERS["guest"].seal(_points("guest", "s1")))  # sent before the restart
    _open(worker, hub, "s2")  # the flow's recovery
    assert _filed(worker) == [] and len(worker.early) == 1
    worker.early.seconds = 0.0
    worker.early.expire()
    assert len(worker.early) == 0
    assert caplog.text.count("from 'guest' for job 'job' (session s1): the job did not open") == 1


def test_kept_mail_meets_the_mailbox_limits_and_expires_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    worker, _ = _worker(tmp_path)
    worker.early.seconds = 0.0
    sent = {"guest": [SEALERS["guest"].seal(_points("guest", "s0", stage=k, pad=100))
                      for k in range(3)],
            "other": [SEALERS["other"].seal(_points("other", "s0"))]}
    for data in [*sent["guest"], *sent["other"]]:
        worker.handle_bytes(data)
    worker.early.expire()
    worker.early.expire()
    expired = [r.getMessage() for r in caplog.records if "did not open here" in r.getMessage()]
    assert sorted(expired) == sorted(
        f"host: dropped {len(sent[p])} peer messages (PSI_POINTS, "
        f"{sum(map(len, sent[p]))} bytes) from {p!r} for job 'job' (session s0): the job did "
        f"not open here within 0 s" for p in ("guest", "other"))
    # what opens the job meets its mailbox's limits (sizes as on the wire)
    worker.early.seconds = 60.0
    for stage in range(3):
        worker.handle_bytes(SEALERS["guest"].seal(_points("guest", "s1", stage=stage,
                                                          pad=1000)))
    opener = Envelope("job", "s1/open", "flow", "host", MsgType.OPEN_JOB, OpenJob(_spec()))
    original = worker._open

    def small_mailbox(env: Envelope, session: str):  # type: ignore[no-untyped-def]
        job = original(env, session)
        if job is not None:
            job.mailbox.sender_limit = (10, 2500)
        return job

    monkeypatch.setattr(worker, "_open", small_mailbox)
    caplog.clear()
    worker.handle_bytes(SEALERS["flow"].seal(opener))
    assert _filed(worker) == [("guest", 0), ("guest", 1)]
    assert "dropped PSI_POINTS from 'guest' of job 'job': mailbox full" in caplog.text


def test_mask_keys_of_a_horizontal_member_are_peer_mail() -> None:
    """Every protocol's peer messages count, without a list to keep: what is not a command,
    work or a reply (e.g. the horizontal member's mask key)."""
    mail = _mail()
    key = Envelope("job", "s1/open", "guest", "host", MsgType.H_MASK_KEY, MaskPublicKey(b"k" * 32))
    assert mail.keep(key, "s1", 50, None)
