"""The transcript attack harness (issue 36, item 5): record everything each role receives in a
whole job, then attack it the ways docs/DESIGN.md's test of a privacy statement lists.

A check in ``tests/privacy/`` runs a real job (real Prefect, real worker processes on the
embedded hub, which taps every message that crosses between parties), takes the transcript of
one role and runs generic attacks against it:

- ``public_seeds`` / ``replay``: every integer in the job spec and in every message the role
  received, tried as the seed of the draws another party makes (with the small integers a
  protocol mixes in: tree, member, ensemble numbers), compared with what the role observed;
- ``determined_by_counts``: a row-by-cell 0/1 matrix solved from the counts and sums received
  (least squares with bounds; a cell is *determined* when no other 0/1 solution fits);
- ``overlapping_differences``: every pair of sums over nested row sets, within a job and across
  two jobs, differenced;
- ``best_direction_auc`` / ``best_correlation``: every numeric field and its principal
  directions against the labels and raw values.

Each row of docs/threat-model.md names the check that pins it; a check must fail on the leaking
code (each test says which commit it was seen failing on).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from fedboost.embedded import FLOW_ENDPOINT, train_embedded
from messages.codec import to_wire
from messages.envelope import Envelope, Kind, decode_envelope
from messages.transport import MemoryHub

__all__ = ["FLOW_ENDPOINT", "Received", "Transcript", "best_correlation", "best_direction_auc",
           "blobs", "determined_by_counts", "integers", "leaves", "numbers",
           "overlapping_differences", "record_training", "replay", "public_seeds"]


@dataclass(frozen=True)
class Received:
    """One message as its recipient got it: the signed frame opened to its envelope."""

    sender: str
    recipient: str
    envelope: Envelope

    @property
    def kind(self) -> Kind:
        return self.envelope.kind

    @property
    def body(self) -> Any:
        return self.envelope.body


@dataclass
class Transcript:
    """Everything that crossed between the parties of one job, and the job's spec."""

    config: Any
    messages: list[Received] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)

    def received_by(self, party: str) -> list[Received]:
        """What ``party`` received from the others (its own loopback messages left out)."""
        return [m for m in self.messages if m.recipient == party and m.sender != party]

    def of_kind(self, party: str, *kinds: Kind) -> list[Received]:
        return [m for m in self.received_by(party) if m.kind in kinds]

    def kinds(self, party: str) -> set[Kind]:
        return {m.kind for m in self.received_by(party)}


def _open(sealed: bytes) -> Envelope:
    """The envelope inside a signed frame (what the recorder sees is what crossed the wire)."""
    return decode_envelope(msgpack.unpackb(sealed)["envelope"])


def record_training(config: Any, out_dir: Path) -> Transcript:
    """Train ``config`` on the embedded hub with its tap on; every message between parties."""
    hub = MemoryHub([*config.parties, FLOW_ENDPOINT], record=True)
    result = train_embedded(config, out_dir, hub=hub)
    messages = [Received(s, r, _open(d)) for s, r, d in hub.recorded()]
    return Transcript(config=config, messages=messages, result=result)


# -- what a body carries ----------------------------------------------------------------------

def leaves(value: Any) -> list[Any]:
    """The scalar and bytes leaves of a body's wire form (lists and dicts walked)."""
    if isinstance(value, dict):
        return [b for k, v in value.items() for b in (*leaves(k), *leaves(v))]
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in leaves(v)]
    return [value]


def _wire_leaves(body: Any) -> list[Any]:
    return leaves(to_wire(body))


def blobs(body: Any) -> bytes:
    """Every bytes field of a body, joined."""
    return b"".join(v for v in _wire_leaves(body) if isinstance(v, bytes))


def numbers(body: Any) -> set[float]:
    """Every float a body carries: float fields, and bytes fields read as float64 words."""
    out: set[float] = set()
    for value in _wire_leaves(body):
        if isinstance(value, float):
            out.add(value)
        elif isinstance(value, bytes) and len(value) % 8 == 0:
            out.update(np.frombuffer(value, dtype="<f8").tolist())
    return out


def integers(body: Any) -> set[int]:
    """Every non-negative integer field of a body (bools left out): the candidates for a seed."""
    return {v for v in _wire_leaves(body)
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64}


# -- replaying public seeds -------------------------------------------------------------------

def public_seeds(transcript: Transcript, party: str) -> set[int]:
    """Every integer ``party`` can see that could seed another party's draws: the job spec's
    (any field, at any depth) and every integer field of every message it received."""
    spec = transcript.config.model_dump(mode="json")
    seeds = {v for v in leaves(spec) if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
    for message in transcript.received_by(party):
        seeds |= integers(message.body)
    return seeds


def replay(seeds: Iterable[int], mixes: Sequence[Iterable[int]],
           draw: Callable[[np.random.Generator], Any],
           observed: Callable[[Any], bool]) -> list[tuple[int, ...]]:
    """Seed lists ``[seed, *mix]`` (every public seed with every combination of the small
    integers in ``mixes``, and each seed alone) whose draw ``observed`` accepts; an empty list
    means the replay predicted nothing."""
    hits = []
    mix_tuples = [()] + list(itertools.product(*mixes)) if mixes else [()]
    for seed in sorted(set(seeds)):
        for mix in mix_tuples:
            key = (seed, *mix)
            if observed(draw(np.random.default_rng(list(key)))):
                hits.append(key)
    return hits


# -- solving counts and sums ------------------------------------------------------------------

def determined_by_counts(design: np.ndarray, counts: np.ndarray,
                         prior: np.ndarray | None = None) -> np.ndarray:
    """Which unknowns of ``design @ x = counts`` (x in {0, 1}) the equations pin down.

    An unknown is determined when the linear relaxation (0 <= x <= 1) forces it: its minimum
    and maximum over the feasible set agree (one LP each way). Returns a bool per unknown;
    ``prior`` (0/1 per unknown, the truth) lets a check count how many are determined *and*
    right. Equations that have no feasible point give all False (the attacker learns nothing
    it can trust).
    """
    from scipy.optimize import linprog

    n = design.shape[1]
    bounds = [(0.0, 1.0)] * n
    out = np.zeros(n, dtype=bool)
    for j in range(n):
        c = np.zeros(n)
        c[j] = 1.0
        low = linprog(c, A_eq=design, b_eq=counts, bounds=bounds, method="highs")
        if low.status != 0:
            return np.zeros(n, dtype=bool)
        high = linprog(-c, A_eq=design, b_eq=counts, bounds=bounds, method="highs")
        out[j] = abs(low.fun + high.fun) < 1e-6
    if prior is not None:
        solution = _any_solution(design, counts)
        out &= np.isclose(solution, prior)
    return out


def _any_solution(design: np.ndarray, counts: np.ndarray) -> np.ndarray:
    from scipy.optimize import linprog

    n = design.shape[1]
    res = linprog(np.zeros(n), A_eq=design, b_eq=counts, bounds=[(0.0, 1.0)] * n,
                  method="highs")
    return np.round(res.x) if res.status == 0 else np.full(n, np.nan)


def overlapping_differences(sums: dict[Any, tuple[frozenset[int], np.ndarray]]
                            ) -> Iterator[tuple[Any, Any, frozenset[int], np.ndarray]]:
    """Every pair of received sums over nested row sets and their difference: the sum over the
    rows one holds and the other does not (``(key_big, key_small, rows, difference)``)."""
    items = list(sums.items())
    for (ka, (ra, va)), (kb, (rb, vb)) in itertools.permutations(items, 2):
        if rb < ra:
            yield ka, kb, ra - rb, np.asarray(va) - np.asarray(vb)


# -- geometry: numeric fields against what is secret --------------------------------------------

def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    auc = float(roc_auc_score(labels, scores))
    return max(auc, 1.0 - auc)


def best_direction_auc(features: np.ndarray, labels: np.ndarray, directions: int = 5) -> float:
    """The best AUC that any single column or any of the first ``directions`` principal
    directions of ``features`` (rows x fields) reaches on ``labels`` (either sign)."""
    candidates = _columns_and_directions(features, directions)
    return max((_auc(c, labels) for c in candidates), default=0.5)


def best_correlation(features: np.ndarray, target: np.ndarray, directions: int = 5) -> float:
    """The largest |Pearson correlation| of ``target`` with any column or principal direction
    of ``features``."""
    t = np.asarray(target, dtype=float)
    return max((abs(float(np.corrcoef(c, t)[0, 1]))
                for c in _columns_and_directions(features, directions)), default=0.0)


def _columns_and_directions(features: np.ndarray, directions: int) -> list[np.ndarray]:
    """The standardised finite, non-constant columns of ``features`` and the projections on
    its first ``directions`` principal directions (none when no column is left)."""
    x = np.asarray(features, dtype=float)
    x = x[:, np.isfinite(x).all(axis=0) & (np.ptp(x, axis=0) > 0)]
    if x.shape[1] == 0:
        return []
    centred = (x - x.mean(axis=0)) / x.std(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return [*centred.T, *(centred @ vt[:directions].T).T]
