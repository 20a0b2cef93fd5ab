"""Which member sets a member trained with on each of its data sets, across jobs (issue 36).

Within a job the masks and the root seals keep the aggregator from two sums over different
member sets (``workers.horizontal.released``). Across jobs nothing did: the same job run with
members ``{a, b, c}`` and then ``{a, b}`` over the same rows gives the aggregator the set-up
counts of both, whose difference is ``c``'s count in every grid cell (and the roots', ``c``'s
histograms). Only the members that take part in both jobs can refuse (``c`` is not asked the
second time), so each member keeps this ledger on its own disk, in its private state folder
(``PartySpec.private_dir``, 0600 through ``boosting.tree.open_private``), for every job over
every data set it opens, and refuses a job over a data set it trained on whose member set,
compared with an earlier one's, lets the aggregator subtract (:func:`exposure`): the new set is
a strict subset or superset of an earlier one, so the difference of the two jobs' sums is the
sum over the members in one and not the other (one member's vectors when they differ by one).
Every set in one member's ledger holds that member; among such sets, no signed combination of
sets that are not nested is one member's alone in any of the sequences of up to five jobs over
five members (tried exhaustively), so nesting is the rule.

The identical set is always allowed: a resumed job, the same job run again or a new job with the
same members adds no new combination. A data set is recognised by its file (resolved path) or by
its rows' content (a digest of its ids, features and labels): the same rows under another file
name are still the same data set. What a member cannot see is not covered: jobs it did not join
(``{b, c}`` run without ``a`` after ``{a, b, c}`` is refused by ``b`` and ``c``, not by ``a``),
and other members' rows that change between jobs. See docs/horizontal.md, "Across jobs".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boosting.tree import open_private
from workers import ProtocolError
from workers.data import PartyData
from workers.handlers import StepContext
from workers.policy import PolicyError
from workers.row_partitioned import aggregator_of, members_of

FILE = "horizontal-jobs.json"
log = logging.getLogger("fedboost.worker")


class LedgerError(ProtocolError):
    """The ledger file is not one this module wrote."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One job a member opened over one of its data sets."""

    job: str
    members: tuple[str, ...]
    aggregator: str
    path: str
    content: str
    opened: tuple[str, ...] = ()
    """What it sent under masks: ``setup`` (its set-up counts), ``roots`` (a tree's root)."""


def data_identity(path: str, data: PartyData) -> tuple[str, str]:
    """A data set's resolved file path and a digest of its rows (ids, features, labels)."""
    digest = hashlib.sha256()
    digest.update("\x1f".join(map(str, data.ids)).encode())
    digest.update(np.ascontiguousarray(data.x, dtype="<f8").tobytes())
    if data.y is not None:
        digest.update(np.ascontiguousarray(data.y, dtype="<f8").tobytes())
    return os.path.realpath(path), digest.hexdigest()


def load(folder: Path) -> list[Entry]:
    """The member's ledger (empty when there is none)."""
    path = folder / FILE
    if not path.is_file():
        return []
    try:
        raw: Any = json.loads(path.read_text())
        return [Entry(str(e["job"]), tuple(str(m) for m in e["members"]), str(e["aggregator"]),
                      str(e["path"]), str(e["content"]), tuple(str(o) for o in e["opened"]))
                for e in raw]
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"{path} is not a ledger of horizontal jobs ({exc}): refusing to "
                          f"train without it") from None


def save(folder: Path, entries: list[Entry]) -> None:
    """Write the ledger whole (fsync, then rename) before anything of the job leaves."""
    folder.mkdir(parents=True, exist_ok=True)
    with open_private(folder / FILE) as handle:
        handle.write(json.dumps([{"job": e.job, "members": list(e.members),
                                  "aggregator": e.aggregator, "path": e.path,
                                  "content": e.content, "opened": list(e.opened)}
                                 for e in entries], indent=1))


def exposure(earlier: list[Entry], members: frozenset[str]) -> str:
    """Why a job over the same data set with ``members`` lets the aggregator subtract, given
    the ``earlier`` jobs that opened something ("" when it does not): a strict subset or
    superset of an earlier job's members."""
    if not earlier or any(frozenset(e.members) == members for e in earlier):
        return ""
    for e in earlier:
        old = frozenset(e.members)
        if members < old or old < members:
            alone = sorted(old ^ members)
            return (f"job {e.job!r} had members {sorted(old)}; this one has {sorted(members)}: "
                    f"the difference of the two jobs' sums is {', '.join(alone)}'s alone")
    return ""


def admit_job(ctx: StepContext, spec: Any, path: str, data: PartyData) -> None:
    """The member's own checks of a new job's members, before it sends anything: at least its
    policy's ``horizontal_min_members`` (with two, each member learns the other's exact row
    count and label sum: docs/horizontal.md), and none that exposes a member across jobs
    (:func:`admit`, by its policy's ``horizontal_member_sets``)."""
    me, policy, members = ctx.party.name, ctx.party.policy, members_of(spec)
    if len(members) < policy.horizontal_min_members:
        raise PolicyError(f"party {me} refuses job {ctx.job!r} of {len(members)} members: with "
                          f"fewer than {policy.horizontal_min_members} a member learns another's "
                          f"row count and label sum (its policy horizontal_min_members: "
                          f"{policy.horizontal_min_members})")
    if len(members) == 2:
        log.warning("party %s: job %r has two members: each learns the other's exact row count "
                    "and label sum (policy horizontal_min_members: 3 refuses such jobs)", me,
                    ctx.job)
    admit(ctx.party.private_dir(), me, ctx.job, members, aggregator_of(spec),
          data_identity(path, data), policy.horizontal_member_sets == "refuse")


def admit(folder: Path, me: str, job: str, members: list[str], aggregator: str,
          identity: tuple[str, str], refuse: bool) -> None:
    """Check a new job against the ledger and record it (before the member sends anything).

    Raises
    ------
    PolicyError
        If the job's member set exposes a member (:func:`exposure`) and ``refuse`` (the
        member's policy ``horizontal_member_sets: refuse``, the default).
    """
    path, content = identity
    entries = load(folder)
    same_data = [e for e in entries if e.opened and (e.path == path or e.content == content)]
    why = exposure(same_data, frozenset(members))
    if why:
        if refuse:
            raise PolicyError(f"party {me} refuses job {job!r} over data set {path}: {why} "
                              f"(its policy horizontal_member_sets: refuse)")
        log.warning("party %s: job %r over data set %s: %s (allowed by its policy "
                    "horizontal_member_sets: allow)", me, job, path, why)
    kept = [e for e in entries if not (e.job == job and e.path == path and
                                       e.members == tuple(sorted(members)))]
    previous = [e for e in entries if e not in kept]
    opened = previous[0].opened if previous else ()
    save(folder, [*kept, Entry(job, tuple(sorted(members)), aggregator, path, content, opened)])


def opened(folder: Path, job: str, members: list[str], path: str, what: str) -> None:
    """Record that this member sent ``what`` under masks in ``job`` (once per kind)."""
    entries = load(folder)
    key = (job, tuple(sorted(members)), os.path.realpath(path))
    if any((e.job, e.members, e.path) == key and what in e.opened for e in entries):
        return
    save(folder, [Entry(e.job, e.members, e.aggregator, e.path, e.content,
                        (*e.opened, what) if (e.job, e.members, e.path) == key else e.opened)
                  for e in entries])
