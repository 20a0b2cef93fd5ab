"""The scoring service's bodies (``fedboost serve-model``): a session over a trained model,
rounds that score rows by id, and membership rounds."""

from __future__ import annotations

from dataclasses import dataclass

from messages.bodies import PartyInfo
from messages.kinds import declare


MAX_SCORING_ROWS = 65_536
"""Rows one scoring round may ask for: what a party accepts, whatever a session says."""


@dataclass(frozen=True, slots=True)
class OpenScoring:
    """Command: open a scoring session over the model of trained job ``model_job``.

    Each party loads its part of that model from its own model folder and indexes the rows of
    its data set (``PartyInfo.dataset``) by id, once; the session then scores rows by id in
    rounds (``ScoreRows``) until it is closed. ``protocol`` is the trained job's protocol (its
    model parts are what the session loads): a party's policy must list it, and must allow
    ``batched`` prediction (``policy.predict_modes``) at a passive party.
    """

    parties: list[PartyInfo]
    model_job: str
    max_rows: int
    protocol: str


@dataclass(frozen=True, slots=True)
class ScoreRows:
    """Command, one scoring round: the rows with these ids, in this order (seed 002, Alg. 5:
    passive parties evaluate all their nodes and send the bits to the active party, which
    finishes the traversal). The active party waits at most ``wait_seconds`` for them."""

    round: int
    ids: list[str]
    wait_seconds: float


@dataclass(frozen=True, slots=True)
class FindRows:
    """Command, a membership round: which of these ids has no row here. Every party answers
    ``RowsFound`` and sends nothing else: a scoring round (``ScoreRows``) follows only for ids
    every party holds, so a request that cannot be scored sends no decisions to the active
    party. No ids: a ping (every party answering is what ``GET /readyz`` reports)."""

    round: int
    ids: list[str]


@dataclass(frozen=True, slots=True)
class RoundDecisions:
    """A passive party's decisions for one scoring round, to the active party: ``records``
    are its lookup record ids (uint32 little-endian, ascending: bytes, not a list, so a forest's
    thousands of records cost no per-item decoding), bit ``r * n_rows + i`` row i at record r;
    no records and no rows when it could not score the round (an unknown id)."""

    round: int
    records: bytes
    n_rows: int
    bits: bytes


@dataclass(frozen=True, slots=True)
class RowsFound:
    """A party's reply to ``FindRows``, and a passive party's to ``ScoreRows``: the positions
    (in the round's ids) of ids it has no row for; empty when every id has one (and, answering
    ``ScoreRows``, its decisions went to the active party)."""

    round: int
    unknown: list[int]


@dataclass(frozen=True, slots=True)
class Scores:
    """The active party's reply to ``ScoreRows``: rows x outputs of predictions (float64,
    little-endian, row-major), or, when some id is unknown to it, the positions of those ids
    (and no values); ``incomplete`` names passive parties that could not score the round."""

    round: int
    n_outputs: int
    values: bytes
    unknown: list[int]
    incomplete: list[str]


declare(
    "scoring",
    openers={"OPEN_SCORING": (400, OpenScoring)},
    commands={"SCORE_ROWS": (401, ScoreRows), "FIND_ROWS": (405, FindRows)},
    replies={"ROWS_FOUND": (402, RowsFound), "SCORES": (403, Scores)},
    peer={"ROUND_DECISIONS": (404, RoundDecisions)},
    unrecorded=("SCORE_ROWS", "FIND_ROWS"),
    transient=("SCORE_ROWS", "ROUND_DECISIONS", "ROWS_FOUND", "SCORES", "FIND_ROWS"))
