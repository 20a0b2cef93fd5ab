"""The flow's coordinator: calls in flight give up at once when a party lost the job's state."""

from __future__ import annotations

import threading
import time

import pytest

from flows._tasks import Coordinator, PartyError, StepTimeout
from messages.bodies import ErrorReply, Step
from messages.envelope import MsgType
from messages.signing import federation_sealers
from messages.transport import MemoryHub


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
