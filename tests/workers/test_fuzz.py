"""Hostile input: 10,000+ generated messages at a live passive worker (an open job on real
data). Garbage, mutated envelopes and well-formed envelopes of every kind with arbitrary bodies
(signed by the right key, by an untrusted one, or not at all) must each be dropped or answered
with an error; the worker never raises, never hangs, and its state stays bounded."""

from __future__ import annotations

import dataclasses
import time
import typing
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messages import bodies as b
from messages import secureboost as sb
from messages.envelope import BODY_TYPES, OPENERS, Envelope, MsgType, encode_envelope
from messages.signing import federation_sealers, signer_of
from messages.transport import MemoryHub
from messages.params import TreeParams
from tests.scenarios import DATA, TEST_POLICY
from workers.party import PartySpec
from workers.protocols import PROTOCOLS
from workers.runtime import MAX_PENDING, Worker

_SMALL_INT = st.integers(-3, 40) | st.integers(-2**63, 2**63 - 1)


def _value(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if tp is int:
        return _SMALL_INT
    if tp is float:
        return st.floats(allow_nan=True)
    if tp is bool:
        return st.booleans()
    if tp is str:
        return st.sampled_from(["host", "guest", "flow", "", "x" * 40]) | st.text(max_size=8)
    if tp is bytes:
        return st.binary(max_size=96)
    if origin is list:
        return st.lists(_value(typing.get_args(tp)[0]), max_size=4)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return st.one_of([_value(a) for a in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if dataclasses.is_dataclass(tp):
        return _body(tp)
    raise TypeError(f"no strategy for {tp!r}")


def _body(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)  # in the namespace of the body's own module
    return st.builds(cls, **{f.name: _value(hints[f.name]) for f in dataclasses.fields(cls)})


_KINDS = [k for k in MsgType if k not in OPENERS]
_ENVELOPES = st.builds(
    Envelope, job=st.sampled_from(["fuzz", "other"]), task=st.text(max_size=6),
    sender=st.sampled_from(["guest", "host", "flow"]), recipient=st.sampled_from(["host", "guest"]),
    kind=st.sampled_from(_KINDS), body=st.none()).flatmap(
        lambda env: _body(BODY_TYPES[env.kind]).map(lambda body: dataclasses.replace(env, body=body)))


def _mutate(data: bytes, cuts: list[int], flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, value in flips:
        if out:
            out[at % len(out)] = value
    for cut in cuts:
        out = out[: cut % (len(out) + 1)]
    return bytes(out)


SEALERS = federation_sealers(["guest", "host"])
ROGUE = federation_sealers(["guest", "host"])
"""Well-formed keys the worker does not trust: forged signatures."""


def _seal(env: Envelope, forged: bool) -> bytes:
    return (ROGUE if forged else SEALERS)[signer_of(env.sender)].seal(env)


_CUTS = st.lists(st.integers(0, 10_000), max_size=1)
_FLIPS = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3)
# Messages are described here and built in the test: signing draws fresh nonces, which must not
# happen inside a strategy (Hypothesis replays strategies).
_MESSAGES = st.one_of(
    st.tuples(st.just("raw"), st.binary(max_size=200)),
    st.tuples(st.just("unsigned"), _ENVELOPES),
    st.tuples(st.just("signed"), _ENVELOPES, st.booleans()),
    st.tuples(st.just("mutated"), _ENVELOPES, st.booleans(), _CUTS, _FLIPS),
)


def _build(message: tuple[Any, ...]) -> bytes:
    match message:
        case ("raw", data):
            return bytes(data)
        case ("unsigned", env):
            return encode_envelope(env)
        case ("signed", env, forged):
            return _seal(env, forged)
        case ("mutated", env, forged, cuts, flips):
            return _mutate(_seal(env, forged), cuts, flips)
    raise AssertionError(message)


_SPEC = sb.JobSpec([b.PartyInfo("guest", "active"), b.PartyInfo("host", "passive")],
                  TreeParams(n_trees=2, max_depth=3), False, 1024, 0.0, 0, "y")


def _open(worker: Worker) -> None:
    """Open the job in a new session, as a flow does (an answered task id is never rerun)."""
    task = f"{uuid.uuid4().hex[:12]}/open"
    worker.handle_bytes(SEALERS["flow"].seal(Envelope("fuzz", task, "flow", "host",
                                                      MsgType.OPEN_JOB, sb.OpenJob(_SPEC))))
    assert worker.jobs["fuzz"].state is not None


@pytest.fixture(scope="module")
def live_worker(tmp_path_factory: pytest.TempPathFactory) -> tuple[Worker, MemoryHub]:
    hub = MemoryHub(["host", "guest", "flow"])
    party = PartySpec("host", "passive", str(DATA / "breast_hetero_host.csv"), "id", None,
                      str(tmp_path_factory.mktemp("fuzz")), policy=TEST_POLICY)
    worker = Worker(party, hub.endpoint("host"), PROTOCOLS, SEALERS["host"])
    _open(worker)
    return worker, hub


def _drain(hub: MemoryHub) -> None:
    for name in ("flow", "guest"):
        endpoint = hub.endpoint(name)
        while endpoint.receive(timeout=0.0) is not None:
            pass


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(message=_MESSAGES)
def test_the_worker_survives_any_message(live_worker: tuple[Worker, MemoryHub],
                                         message: tuple[Any, ...]) -> None:
    data = _build(message)
    worker, hub = live_worker
    if "fuzz" not in worker.jobs:  # a generated CLOSE_JOB closed it
        _open(worker)
    start = time.perf_counter()
    worker.handle_bytes(data)  # never raises
    assert time.perf_counter() - start < 10.0, "a single message took too long"
    assert set(worker.jobs) <= {"fuzz"}  # no state for jobs that were never opened
    assert all(len(job.pending) <= MAX_PENDING for job in worker.jobs.values())
    _drain(hub)

