"""The flow's coordinator: calls in flight give up at once when a party lost the job's state
or is gone, and a step that keeps waiting says for whom."""

from __future__ import annotations

import contextvars
import re
import threading
import time
import uuid

import pytest
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.coordinator import Coordinator, PartyError, PartyGone, StepTimeout, attached, link
from flows.progress import PartiesSilent, TreeProgress, listening, report
from messages import TransportError
from messages.bodies import Ack, ErrorReply, Step
from messages.envelope import Envelope, MsgType
from messages.signing import federation_sealers
from messages.transport import MemoryHub


@task(cache_policy=NO_CACHE)
def _whose_session(job: str) -> str:
    report(job, TreeProgress(1, 1, 0.0))
    return link(job).session


@flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
def _two_submitted_tasks(job: str) -> list[str]:
    futures = [_whose_session.submit(job) for _ in range(2)]
    return [future.result() for future in futures]


@pytest.mark.usefixtures("prefect_harness")
def test_each_run_reaches_its_own_coordinator_and_listener_from_its_tasks() -> None:
    """Two runs of one job at once in one process, each attaching its coordinator and listener
    in its own thread: the tasks Prefect runs in its pool threads reach those of their own run
    only (a table by job in a module would hand both runs the same ones), and a thread that
    attached nothing reaches none."""
    sealer = federation_sealers([])["flow"]
    both_attached, both_ran = threading.Barrier(2), threading.Barrier(2)
    seen: dict[int, tuple[str, list[str], int]] = {}

    def run(k: int) -> None:
        coordinator = Coordinator("job", MemoryHub(["flow"]).endpoint("flow"), sealer)
        heard: list[object] = []
        with attached(coordinator), listening("job", heard.append):
            both_attached.wait(30)
            sessions = _two_submitted_tasks("job")
            both_ran.wait(120)
        seen[k] = (coordinator.session, sessions, len(heard))

    runs = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(180)
    assert sorted(seen) == [0, 1]
    assert seen[0][0] != seen[1][0]
    for session, sessions, heard in seen.values():
        assert sessions == [session, session] and heard == 2
    with pytest.raises(TransportError, match="no transport attached"):
        link("job")


def test_calls_in_flight_give_up_when_a_party_lost_the_state() -> None:
    """A forest grows trees side by side: once one of them hears that the host restarted,
    the others must not wait out the step timeout (an hour by default) for the host's part."""
    hub = MemoryHub(["flow", "guest", "host"])
    sealers = federation_sealers(["guest", "host"])
    coord = Coordinator("job", hub.endpoint("flow"), sealers["flow"], timeout=600)
    outcome: list[BaseException] = []

    def waiting_tree() -> None:  # its command reached a worker that will never answer
        try:
            coord.call(["guest"], MsgType.BUILD_HISTOGRAMS, Step(0, 1), "build_histograms/t1")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    tree = threading.Thread(target=waiting_tree)
    tree.start()
    time.sleep(0.3)
    lost = ErrorReply("host", "F_LEVEL", "job 'job' is not open here (worker restarted?)", False,
                      state_lost=True)
    started = time.monotonic()
    coord.abandon(lost)
    tree.join(10)
    assert not tree.is_alive() and time.monotonic() - started < 3
    assert isinstance(outcome[0], PartyError) and outcome[0].reply is lost
    guest = hub.endpoint("guest")
    assert guest.receive(timeout=1) is not None  # the waiting tree's command
    with pytest.raises(PartyError):  # a retry in the lost session sends nothing
        coord.call(["guest"], MsgType.BUILD_HISTOGRAMS, Step(0, 1), "build_histograms/t1/a2")
    assert guest.receive(timeout=0.3) is None

    coord.begin_session()  # the job is opened again: calls wait for answers as before
    coord.timeout = 0.5
    with pytest.raises(StepTimeout):
        coord.call(["guest"], MsgType.BUILD_HISTOGRAMS, Step(0, 1), "build_histograms/t1")


def test_a_step_says_whom_it_waits_for_and_fails_at_once_when_a_party_is_gone() -> None:
    """A silent party is named after ``first_notice`` seconds and again every
    ``notice_every`` (on the progress listener, the command line's bar or lines), with what is
    known of every party of the job (the silent one may wait for another's peer messages); a
    party whose worker is known to have stopped ends the step, naming it: at once when the step
    waits for it, after ``first_notice`` seconds when it waits for others (they may answer
    from what it sent before it stopped)."""
    hub = MemoryHub(["flow", "guest", "host"])
    sealers = federation_sealers(["guest", "host"])
    gone: dict[str, str] = {}
    coord = Coordinator("job", hub.endpoint("flow"), sealers["flow"], timeout=600,
                        parties=("guest", "host"),
                        gone=lambda parties: {p: gone[p] for p in parties if p in gone},
                        presence=lambda parties: {"host": "its worker process is stopped"},
                        first_notice=0.5, notice_every=1.0)
    heard: list[object] = []
    outcome: list[BaseException] = []

    def step() -> None:  # guest waits for host's peer messages, say
        try:
            coord.call(["guest"], MsgType.BROADCAST_NODES, Step(2, 1), "broadcast_nodes/t2/d1")
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    with listening("job", heard.append):
        # a thread of the flow's own, as Prefect starts a task's: in a copy of its context
        waiting = threading.Thread(target=contextvars.copy_context().run, args=(step,))
        waiting.start()
        time.sleep(2.2)
        gone["host"] = "its worker process was killed by signal SIGKILL"
        started = time.monotonic()
        waiting.join(10)
    assert not waiting.is_alive() and time.monotonic() - started < 3
    silent = [e for e in heard if isinstance(e, PartiesSilent)]
    assert len(silent) == 2, heard  # at 0.5 s and at 1.5 s
    assert silent[0].parties == ("guest",) and silent[1].waited > silent[0].waited
    assert re.fullmatch(r"waiting [01] s \(since \d\d:\d\d:\d\d\) for guest to answer "
                        r"broadcast_nodes \(tree 2, depth 1\); host: its worker process is "
                        r"stopped", silent[0].text()), silent[0].text()
    assert isinstance(outcome[0], PartyGone) and outcome[0].missing == ["host"]
    assert str(outcome[0]) == ("party host: its worker process was killed by signal SIGKILL "
                               "while the flow waited for guest to answer broadcast_nodes "
                               "(tree 2, depth 1)")


def test_a_party_gone_after_its_part_does_not_fail_a_step_that_waits_for_others() -> None:
    """A horizontal member that dies right after its histograms are in: the aggregator's sum
    still comes, so the step waiting for the aggregator ends normally within ``first_notice``
    (under load the flow saw the member gone first and failed the whole job)."""
    hub = MemoryHub(["flow", "aggregator", "host_2"])
    sealers = federation_sealers(["aggregator", "host_2"])
    coord = Coordinator("job", hub.endpoint("flow"), sealers["flow"], timeout=600,
                        parties=("aggregator", "host_2"),
                        gone=lambda parties: {p: "its worker process exited with code 1"
                                              for p in parties if p == "host_2"},
                        first_notice=5.0, notice_every=5.0)
    aggregator = hub.endpoint("aggregator")

    def answer() -> None:  # the aggregator sums what it already holds, after a while
        raw = aggregator.receive(timeout=5)
        assert raw is not None
        command = sealers["aggregator"].open(raw)
        time.sleep(1.0)
        aggregator.send("flow", sealers["aggregator"].seal(Envelope(
            job="job", task=command.task, sender="aggregator", recipient="flow",
            kind=MsgType.ACK, body=Ack(3))))

    threading.Thread(target=answer).start()
    replies = coord.call(["aggregator"], MsgType.BUILD_HISTOGRAMS, Step(2, 1), "secure_sum/t2/d1")
    assert replies == {"aggregator": Ack(3)}
    with pytest.raises(PartyGone):  # waiting for it: at once
        coord.call(["host_2"], MsgType.BUILD_HISTOGRAMS, Step(2, 1), "grow/t2/d1")
    # once the flow drops it, it ends no step however long one waits for the others
    coord.leave(["host_2"])
    coord.first_notice = 0.0
    threading.Thread(target=answer).start()
    replies = coord.call(["aggregator"], MsgType.BUILD_HISTOGRAMS, Step(3, 0), "secure_sum/t3/d0")
    assert replies == {"aggregator": Ack(3)}


def test_over_rabbitmq_a_silent_party_without_a_worker_is_named_so(rabbit_url: str) -> None:
    """The flow asks the broker whether anybody consumes a silent party's queue."""
    from flows.coordinator import _unconsumed
    from messages.rabbit_queues import delete_party_queues
    from messages.rabbitmq import RabbitTransport

    tag = uuid.uuid4().hex[:6]
    flow = RabbitTransport(f"flow.{tag}", rabbit_url, party=False)
    here = RabbitTransport(f"here{tag}", rabbit_url, party=True)  # a connected worker's queue
    gone = RabbitTransport(f"gone{tag}", rabbit_url, party=True)
    gone.close()  # its queue stays; nobody consumes it
    try:
        assert _unconsumed(flow, [f"here{tag}", f"gone{tag}", f"never{tag}"]) == {
            f"gone{tag}": "no worker of it is connected to the broker",
            f"never{tag}": "no worker of it is connected to the broker"}
        assert flow.consumers(f"here{tag}") == 1
    finally:
        here.close()
        flow.delete_inbox()
        flow.close()
        delete_party_queues(rabbit_url, [f"here{tag}", f"gone{tag}"])
