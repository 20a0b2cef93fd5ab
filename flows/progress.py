"""A training run's progress as its flow reports it, for whoever started the flow to show.

The flow runs in the process that started it (the embedded default, or ``fedboost train``
over RabbitMQ); a listener registered there for the job (the command line's progress bar)
hears every event. It is registered in the caller's context (a ``ContextVar``), which the flow
shares and Prefect copies into every task it submits, so a listener hears its own flows only. A flow run of a deployment has no listener: the Prefect UI shows its
progress artifact instead. Events carry counts, seconds and training metrics, never data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from flows.declared import declared
from messages.envelope import OPENERS, Kind, MsgType

SHARED_STAGES: dict[Kind, str] = {
    MsgType.RESUME_JOB: "resuming",
    **dict.fromkeys([MsgType.TRAVERSE_LEVEL, MsgType.EVALUATE_VALIDATION], "validation"),
    **dict.fromkeys([MsgType.SAVE_MODEL, MsgType.CLOSE_JOB], "saving"),
}
"""Steps several protocols share, by the stage they belong to; each protocol declares its own
(``flows.declared``), openers are "opening", all other steps grow trees."""
TREES = "trees"


def stage_of(kind: Kind) -> str:
    """The stage a step belongs to, as its protocol declares it."""
    if kind in OPENERS:
        return "opening"
    if kind in SHARED_STAGES:
        return SHARED_STAGES[kind]
    for protocol in declared().values():  # a step of messages.bodies or .secureboost serves several
        if kind in protocol.stages:
            return protocol.stages[kind]
    return TREES


@dataclass(frozen=True, slots=True)
class StepProgress:
    """A protocol step is under way: ``answered`` of ``parties`` have replied."""

    stage: str
    step: str
    answered: int
    parties: int


@dataclass(frozen=True, slots=True)
class TreeProgress:
    """A tree is done: ``done`` of ``total`` (trees of an earlier run included)."""

    done: int
    total: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartiesSilent:
    """Step ``step`` has waited ``waited`` seconds (since ``since``, local clock time) for
    ``parties``; ``notes``: what is known of any party of the job (party, note), e.g. the one
    a silent party itself waits for."""

    step: str
    parties: tuple[str, ...]
    waited: float
    since: str
    notes: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """'waiting 90 s (since 10:02:11) for guest to answer broadcast_nodes (tree 1, depth
        0); host: its worker process is stopped'."""
        notes = "".join(f"; {party}: {note}" for party, note in self.notes)
        return (f"waiting {self.waited:.0f} s (since {self.since}) for "
                f"{', '.join(self.parties)} to answer {step_text(self.step)}{notes}")


def step_text(step: str) -> str:
    """A step id as a user reads it: 'build_histograms/t3/d1' -> 'build_histograms (tree 3,
    depth 1)' (trees and depths count from 0, as everywhere else)."""
    kind, *coords = step.split("/")
    named = {"t": "tree", "d": "depth", "a": "attempt"}
    parts = [f"{named[c[0]]} {c[1:]}" for c in coords
             if c[:1] in named and c[1:].isdigit() and not (c[0] == "a" and c[1:] == "0")]
    return f"{kind} ({', '.join(parts)})" if parts else kind


ProgressEvent = StepProgress | TreeProgress | PartiesSilent
Listener = Callable[[ProgressEvent], None]

_LISTENING: ContextVar[tuple[str | None, Listener] | None] = ContextVar("fedboost_listener",
                                                                        default=None)
"""The job (``None``: any) whose progress this context's listener hears, and the listener."""


@contextmanager
def listening(job: str | None, listener: Listener) -> Iterator[None]:
    """Let ``listener`` hear the progress of ``job``'s flow (``None``: of any job, as the
    command line runs one) while the block runs; the flow must be called inside the block, in
    this thread (its submitted tasks inherit the listener)."""
    token = _LISTENING.set((job, listener))
    try:
        yield
    finally:
        _LISTENING.reset(token)


def _listener(job: str) -> Listener | None:
    entry = _LISTENING.get()
    if entry is None or entry[0] not in (job, None):
        return None
    return entry[1]


def report(job: str, event: ProgressEvent) -> None:
    """Tell the job's listener, if any, about ``event``."""
    listener = _listener(job)
    if listener is not None:
        listener(event)


def has_listener(job: str) -> bool:
    """Whether someone (the command line) shows ``job``'s progress."""
    return _listener(job) is not None


def tell_silence(job: str, event: PartiesSilent) -> None:
    """Report parties that keep a step waiting."""
    report(job, event)


def step_progress(job: str, kind: Kind, answered: int, parties: int) -> None:
    """Report a step's replies so far (stage from :func:`stage_of`)."""
    if _listener(job) is not None:
        report(job, StepProgress(stage_of(kind), kind.name.lower(), answered,
                                 parties))


def tree_done(job: str, done: int, total: int, seconds: float,
              metrics: dict[str, object]) -> None:
    """Report a finished tree with its training metrics (numbers only)."""
    if _listener(job) is not None:
        numbers = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        report(job, TreeProgress(done, total, seconds, numbers))
