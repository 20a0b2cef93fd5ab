"""The bodies every protocol shares: a job's parties, steps and replies, checkpoints and resuming,
and the alignment (PSI) of the vertical protocols.

Commands come from the flow and are answered with ``Ack``, a typed reply, or ``ErrorReply``;
peer messages go party to party. Each protocol's own bodies are in ``messages.<protocol>``
(SecureBoost's in ``messages.secureboost``, the scoring service's in ``messages.scoring``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from messages.instance_space import InstanceSpace
from messages.kinds import declare


# ---- job set-up ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartyInfo:
    """A party's name, its role in the job ("active"/"passive"; "member"/"aggregator") and the
    name of the data set it uses, in its own worker file ("": its default data set)."""

    name: str
    role: str
    dataset: str = ""


@dataclass(frozen=True, slots=True)
class Step:
    """Command for one protocol step at given coordinates (-1 where not applicable)."""

    tree: int = -1
    depth: int = -1
    owners: list[str] = field(default_factory=list)


# ---- replies --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ack:
    """Reply: the step is done; ``count`` is step-specific (rows, features, nodes)."""

    count: int = 0


@dataclass(frozen=True, slots=True)
class Aligned:
    """Reply of psi_intersect: aligned rows, and how many are for training / validation."""

    n_aligned: int
    n_train: int
    n_valid: int


@dataclass(frozen=True, slots=True)
class Metric:
    """A named metric value."""

    name: str
    value: float


@dataclass(frozen=True, slots=True)
class TreeFinished:
    """Reply of finish_tree at the active party: training metrics after this tree."""

    metrics: list[Metric]
    per_tree: list[list[Metric]] = field(default_factory=list)
    """Validation replies only: the metrics after each tree (the learning curve), or none
    when the margins after every tree would not fit in memory."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Reply: the step failed; ``user_error`` marks bad input (data, config) vs a fault."""

    party: str
    step: str
    message: str
    user_error: bool
    state_lost: bool = False
    """The party has no state for the job (its worker restarted): the flow may resume the job
    from the parties' checkpoints."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A party's saved job state after ``trees_done`` trees of training run ``run`` (a digest
    of the run's Paillier public key: checkpoints of different runs never mix)."""

    trees_done: int
    run: str


@dataclass(frozen=True, slots=True)
class Opened:
    """Reply of open_job: rows loaded, and the checkpoints this party holds for exactly this
    job (same spec, same data)."""

    rows: int
    checkpoints: list[Checkpoint]


@dataclass(frozen=True, slots=True)
class ResumeJob:
    """Command: restore the checkpoint every party holds."""

    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class Resumed:
    """Reply of resume_job: the state restored after ``trees_done`` trees. The active party
    also reports what the flow learnt before (alignment, trees per round, per-tree metrics)."""

    trees_done: int
    n_aligned: int
    n_train: int
    n_valid: int
    outputs: int
    history: list[TreeFinished]


# ---- PSI ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PsiPoints:
    """Blinded id points: stage 1 a passive party's own, 2 the active party's,
    3 the active party's re-blinded by the passive party (same order as stage 2)."""

    stage: int
    points: bytes


@dataclass(frozen=True, slots=True)
class AlignedRows:
    """For each id a passive party sent (its sent order): its aligned row, or -1 (int32 LE).

    ``valid`` marks the aligned rows held out for validation.
    """

    positions: bytes
    valid: InstanceSpace


# The kinds every protocol shares (opening replies, resuming, closing) and the alignment (PSI)
# both vertical protocols run.
declare(
    "core",
    commands={**{name: (number, Step) for name, number in (
        ("PSI_BLIND", 10), ("PSI_REBLIND", 11), ("PSI_INTERSECT", 12), ("CLOSE_JOB", 40))},
              "RESUME_JOB": (41, ResumeJob)},
    replies={"ACK": (100, Ack), "TREE_FINISHED": (102, TreeFinished), "ERROR": (103, ErrorReply),
             "ALIGNED": (104, Aligned), "OPENED": (105, Opened), "RESUMED": (106, Resumed)},
    peer={"PSI_POINTS": (200, PsiPoints), "ALIGNED_ROWS": (201, AlignedRows)})
