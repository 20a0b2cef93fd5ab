"""The toy protocol's messages: one opener, three commands, two peer messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from messages.bodies import PartyInfo, Step
from messages.kinds import declare

NAME = "toy_mean"


@dataclass(frozen=True, slots=True)
class ToySpec:
    parties: list[PartyInfo]
    rounds: int
    learning_rate: float


@dataclass(frozen=True, slots=True)
class OpenToy:
    """Command: load the party's rows and open a toy job."""

    spec: ToySpec
    protocol: ClassVar[str] = NAME

    @property
    def parties(self) -> list[PartyInfo]:
        return self.spec.parties


@dataclass(frozen=True, slots=True)
class GradientSum:
    """Member -> aggregator: its rows' gradient sum and count in one round."""

    tree: int
    g_sum: float
    rows: int


@dataclass(frozen=True, slots=True)
class Leaf:
    """Aggregator -> members: the round's leaf value."""

    tree: int
    value: float


declare(NAME, openers={"T_OPEN_JOB": (900, OpenToy)},
        commands={"T_SEND_SUMS": (901, Step), "T_COMBINE": (902, Step), "T_APPLY": (903, Step)},
        peer={"T_SUMS": (910, GradientSum), "T_LEAF": (911, Leaf)})
