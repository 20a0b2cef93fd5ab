"""Issue 12, item 3: a planted checkpoint that would run code when unpickled, reached through a
job named ``../../..`` or lying in the job's own folder, never runs in a real worker process;
the bad job name is refused by name, a copied or old checkpoint is refused and not offered,
and the worker goes on serving."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.config import ConfigError, parse_config
from messages.bodies import Checkpoint, ErrorReply, PartyInfo, ResumeJob, Step
from messages.secureboost import JobSpec, OpenJob
from messages.envelope import Envelope, Kind, MsgType
from messages.names import is_job_name
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from messages.params import TreeParams
from tests.scenarios import TEST_POLICY
from tests.scenarios import DATA
from tests.workers.test_checkpoint import old_pickled_checkpoint
from workers import ProtocolError, checkpoint
from workers.embedded import start_workers, stop_workers
from workers.handlers import StepContext
from workers.mailbox import Mailbox
from workers.party import PartySpec

HOST_DATA = DATA / "breast_hetero_host.csv"
SPEC = JobSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
               TreeParams(n_trees=2, max_depth=3), False, 1024, 0.0, 0, "y")


def test_planted_checkpoints_never_run_code_in_the_worker(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    models = tmp_path / "site" / "deep" / "models"
    host = PartySpec("host", "passive", str(HOST_DATA), "id", None, str(models / "{job}" / "host"),
                     policy=TEST_POLICY)
    marker = tmp_path / "pwned"
    # where a job named ../../.. would look: models/../../../host/checkpoints
    escaped = tmp_path / "host" / checkpoint.FOLDER
    escaped.mkdir(parents=True)
    (escaped / "trees-000001.ckpt").write_bytes(old_pickled_checkpoint(marker))
    # the real job's own folder: an old pickle, a copy from another party, and a genuine one
    own = models / "job1" / "host"
    digest = checkpoint.job_digest(SPEC, str(HOST_DATA), None)
    checkpoint.save(own, 3, digest, "run-a", {"trees": 3}, checkpoint.key_of(host))
    (own / checkpoint.FOLDER / "trees-000001.ckpt").write_bytes(old_pickled_checkpoint(marker))
    guests = checkpoint.save(tmp_path / "guest", 2, digest, "run-a", {"trees": 2}, os.urandom(32))
    (own / checkpoint.FOLDER / guests.name).write_bytes(guests.read_bytes())

    sealers = federation_sealers(["guest", "host"])
    hub = MemoryHub(["host", "guest", "flow"])
    flow = hub.endpoint("flow")

    def call(job: str, task: str, kind: Kind, body: object,
             wait: float = 60.0) -> Envelope | None:
        flow.send("host", sealers["flow"].seal(Envelope(job, task, "flow", "host", kind, body)))
        data = flow.receive(timeout=wait)
        return None if data is None else sealers["flow"].open(data)

    procs, _ = start_workers(hub, [host], sealers)
    try:
        assert call("../../..", "s/open", MsgType.OPEN_JOB, OpenJob(SPEC), wait=3) is None
        opened = call("job1", "s/open", MsgType.OPEN_JOB, OpenJob(SPEC))
        assert opened is not None and opened.kind == MsgType.OPENED
        assert opened.body.checkpoints == [Checkpoint(3, "run-a")]  # only the genuine one
        resumed = call("job1", "s/resume", MsgType.RESUME_JOB, ResumeJob(Checkpoint(1, "run-a")))
        assert resumed is not None and isinstance(resumed.body, ErrorReply)
        assert "trees-000001.ckpt is a checkpoint of format '2'" in resumed.body.message
        # and a normal job is still served
        fresh = call("job2", "s2/open", MsgType.OPEN_JOB, OpenJob(SPEC))
        assert fresh is not None and fresh.kind == MsgType.OPENED and fresh.body.rows == 569
        assert fresh.body.checkpoints == []
        closed = call("job2", "s2/close", MsgType.CLOSE_JOB, Step())
        assert closed is not None and closed.kind == MsgType.ACK
    finally:
        stop_workers(procs)

    assert not marker.exists(), "a planted pickle ran in the worker"
    log = capfd.readouterr().err
    assert "rejected message: envelope job '../../..' is not a job name" in log
    assert "job1/host/checkpoints/trees-000001.ckpt is a checkpoint of format '2'" in log
    assert "(format 1 and 2 were pickles): refused, never read" in log
    assert ("job1/host/checkpoints/trees-000002.ckpt does not carry this party's authentication "
            "tag") in log


def test_one_rule_for_job_names_in_config_and_envelopes(tmp_path: Path) -> None:
    for bad in ("../../..", "..", ".fedboost", "a/b", "a\\b", "", "x" * 65, "job\n", "j\u00e9b"):
        assert not is_job_name(bad)
        with pytest.raises(ConfigError, match="job must be 1-64 letters"):
            parse_config({"job": bad, "parties": {}}, base=tmp_path, source="job.yaml")
    for good in ("job1", "a.b-c_d", "x" * 64, "0"):
        assert is_job_name(good)


def _context(party: PartySpec, job: str) -> StepContext:
    return StepContext(party, job, "t", None, Mailbox(), lambda *_: None, None, None)  # type: ignore[arg-type]


def test_the_model_folder_stays_inside_the_models_root(tmp_path: Path) -> None:
    root = tmp_path / "models"
    party = PartySpec("host", "passive", str(HOST_DATA), "id", None, str(root / "{job}" / "host"))
    assert _context(party, "job1").model_dir == root / "job1" / "host"
    for job in ("../../..", "..", "a/../../b", "../models-other"):
        with pytest.raises(ProtocolError, match="outside"):
            _context(party, job).model_dir  # noqa: B018
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    root.mkdir(exist_ok=True)
    (root / "linked").symlink_to(outside)  # a folder under the root that leads out of it
    with pytest.raises(ProtocolError, match="job 'linked' would put its model folder outside"):
        _context(party, "linked").model_dir  # noqa: B018
