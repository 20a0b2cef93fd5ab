"""Over the real broker: a worker killed while one of its steps waits for peer data leaves that
command to the broker, and the worker's next process tells the flow the job's state is gone
(the flow then resumes from the checkpoints). Found by the compose smoke test: the host's
worker was killed while its BUILD_HISTOGRAMS waited for its helper's shards; the command had
been acknowledged when it went waiting, its restarted worker never saw it, and the flow waited
out its 300 s step timeout and failed instead of resuming.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.config import parse_config
from flows.secureboost import job_spec
from messages.bodies import ErrorReply, Step
from messages.chunks import FrameSigner
from messages.envelope import Envelope, Kind, MsgType
from messages.rabbit_queues import delete_party_queues
from messages.rabbitmq import HELD_FRAMES, RabbitTransport
from messages.secureboost import OpenJob
from messages.signing import Sealer, federation_sealers
from tests.scenarios import CONFIGS, DATA
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker


@pytest.fixture
def names(rabbit_url: str) -> Iterator[dict[str, str]]:
    """This test's party names (their own queues), deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    names = {role: f"{role}-{tag}" for role in ("guest", "host")}
    yield names
    delete_party_queues(rabbit_url, list(names.values()))


def _serve_until_reply(worker: Worker, host: RabbitTransport, flow: RabbitTransport,
                       sealer: Sealer, seconds: float = 30) -> Envelope | None:
    """Handle the host's queue as ``serve`` does until the flow has a reply (None if none
    came within ``seconds``)."""
    for _ in range(int(seconds / 0.5)):
        raw = host.receive(timeout=0.25)
        if raw is not None:
            worker.handle_bytes(raw)
            host.acknowledge()
        answer = flow.receive(timeout=0.25)
        if answer is not None:
            flow.acknowledge()
            return sealer.open(answer)
    return None


def test_a_worker_killed_while_its_step_waits_leaves_the_command_to_its_next_process(
        rabbit_url: str, names: dict[str, str], tmp_path: Path) -> None:
    # Prepare: the host's worker (a passive party) with a job open, on the real broker
    config = parse_config({
        "job": f"waiting-{names['host']}", "protocol": "vertical_secureboost",
        "parties": {names["guest"]: {"role": "active", "data": str(DATA / "breast_hetero_guest.csv"),
                                     "id": "id", "label": "y"},
                    names["host"]: {"role": "passive", "data": str(DATA / "breast_hetero_host.csv"),
                                    "id": "id"}},
        "params": {"n_trees": 1, "max_depth": 2, "max_bin": 16}, "crypto": {"key_bits": 1024}},
        base=CONFIGS, source="waiting")
    sealers = federation_sealers(list(names.values()))
    flow_name = f"flow.{config.job}.t"

    def endpoint(name: str, party: bool) -> RabbitTransport:
        return RabbitTransport(name, rabbit_url, party=party,
                               frames=FrameSigner(sealers[name.split(".")[0]]))

    def command(kind: Kind, body: object, task: str) -> bytes:
        return sealers["flow"].seal(Envelope(config.job, task, flow_name, names["host"], kind,
                                             body))

    party = PartySpec(names["host"], "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                      str(tmp_path), policy=PartyPolicy(min_key_bits=1024))
    flow, host = endpoint(flow_name, False), endpoint(names["host"], True)
    restarted_host = None
    try:
        first = Worker(party, host, PROTOCOLS, sealers[names["host"]])
        flow.send(names["host"], command(MsgType.OPEN_JOB, OpenJob(job_spec(config)), "s1/open"))
        opened = _serve_until_reply(first, host, flow, sealers["flow"])
        assert opened is not None and opened.kind == MsgType.OPENED, opened

        # Execute: a step that waits for the active party's PSI points, which never come;
        # then the worker's process dies (its connection closes without a word)
        flow.send(names["host"], command(MsgType.PSI_REBLIND, Step(), "s1/psi_reblind"))
        assert _serve_until_reply(first, host, flow, sealers["flow"], seconds=3) is None
        assert [p.env.task for p in first.jobs[config.job].pending] == ["s1/psi_reblind"]
        assert host._held_frames == 1 <= HELD_FRAMES  # noqa: SLF001 - the hold under test
        host.close()
        restarted_host = endpoint(names["host"], True)
        own = sealers[names["host"]]  # a new process: its replay memory starts empty
        restarted = Worker(party, restarted_host, PROTOCOLS,
                           Sealer(own.identity, own.private, dict(own.trusted)))
        told = _serve_until_reply(restarted, restarted_host, flow, sealers["flow"])

        # Assert: the flow hears, within seconds, that the job's state is gone
        assert told is not None, "the restarted worker never saw the waiting command"
        assert told.task == "s1/psi_reblind" and isinstance(told.body, ErrorReply)
        assert told.body.state_lost and "not open here" in told.body.message
    finally:
        for transport in (flow, host, restarted_host):
            if transport is not None:
                transport.close()
