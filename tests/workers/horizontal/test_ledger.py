"""A member's ledger of horizontal jobs (``workers.horizontal.ledger``): which member sets, with
the earlier ones over the same data set, let the aggregator subtract one member's sums, and a
real member worker refusing them in one line while it goes on serving the jobs it may join."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from messages.bodies import ErrorReply, PartyInfo
from messages.envelope import Envelope, Kind, MsgType
from messages.horizontal import HorizontalSpec, MaskPublicKey, OpenHorizontal, Round
from messages.params import TreeParams
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from workers.horizontal import ledger
from workers.horizontal.ledger import Entry, exposure
from workers.pairwise_masks import MaskKey
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
NAMES = ["a", "b", "c", "d"]
SEALERS = federation_sealers([*NAMES, "agg", "flow"])


def _entries(*sets: str) -> list[Entry]:
    return [Entry(f"job{k}", tuple(s), "agg", "/data.csv", "digest", ("setup",))
            for k, s in enumerate(sets)]


@pytest.mark.parametrize("earlier, new, alone", [
    (["abc"], "ab", "c's alone"),           # the brief's attack: c stayed out
    (["ab"], "abc", "c's alone"),           # and the other way round
    (["abcd"], "ab", "c, d's alone"),       # a sum over members that never agreed to it
    (["abd", "ab"], "abc", "c's alone"),    # nested with one earlier set of several
])
def test_member_sets_that_let_the_aggregator_subtract_are_named(earlier: list[str], new: str,
                                                                 alone: str) -> None:
    assert alone in exposure(_entries(*earlier), frozenset(new))


@pytest.mark.parametrize("earlier, new", [
    ([], "ab"), (["abc"], "abc"),           # the first job; the same set (resume, re-run)
    (["abc"], "abd"),                       # c - d: no member alone
    (["abc", "abd"], "acd"),                # no nesting, and no combination is one member
])
def test_member_sets_that_open_no_one_members_sums_are_allowed(earlier: list[str],
                                                               new: str) -> None:
    assert exposure(_entries(*earlier), frozenset(new)) == ""


class Member:
    """Member ``a`` in a real worker (breast_homo_guest.csv); the test plays everyone else."""

    def __init__(self, folder: Path, policy: PartyPolicy) -> None:
        self.hub = MemoryHub([*NAMES, "agg", "flow"])
        self.party = PartySpec("a", "", str(DATA / "breast_homo_guest.csv"), "id", "y",
                               str(folder / "models"), policy=policy)
        self.worker = Worker(self.party, self.hub.endpoint("a"), PROTOCOLS, SEALERS["a"])
        self.steps = 0

    def command(self, job: str, kind: Kind, body: object) -> Envelope:
        self.steps += 1
        self.worker.handle_bytes(SEALERS["flow"].seal(
            Envelope(job, f"s/{self.steps}", "flow", "a", kind, body)))
        data = self.hub.endpoint("flow").receive(timeout=5)
        assert data is not None, f"no reply to {kind.name}"
        return SEALERS["flow"].open(data)

    def open(self, job: str, members: str) -> Envelope:
        spec = HorizontalSpec([*(PartyInfo(m, "member") for m in members),
                               PartyInfo("agg", "aggregator")],
                              TreeParams(n_trees=1, max_depth=2), 2, 256, 0.0, 0.0, -1)
        return self.command(job, MsgType.H_OPEN_JOB, OpenHorizontal(spec))

    def set_up(self, job: str, members: str) -> None:
        """Round 0 of the set-up: ``a`` sends its masked counts (and so opens them)."""
        for m in members[1:]:
            self.worker.handle_bytes(SEALERS[m].seal(Envelope(
                job, "s/peer", m, "a", MsgType.H_MASK_KEY,
                MaskPublicKey(MaskKey.generate().public_bytes()))))
        assert self.command(job, MsgType.H_SUMMARIZE, Round(depth=0)).kind == MsgType.ACK


def test_a_member_refuses_a_second_job_without_a_member_and_goes_on_serving(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    member = Member(tmp_path, PartyPolicy(protocols=("horizontal",)))
    assert member.open("first", "abc").kind == MsgType.OPENED
    member.set_up("first", "abc")
    refused = member.open("second", "ab")
    assert refused.kind == MsgType.ERROR and isinstance(refused.body, ErrorReply)
    assert refused.body.message.startswith("party a refuses job 'second' over data set ")
    assert "job 'first' had members ['a', 'b', 'c']; this one has ['a', 'b']: the " \
           "difference of the two jobs' sums is c's alone" in refused.body.message
    assert "horizontal_member_sets: refuse" in refused.body.message
    # the worker goes on: the first job again (a resume), a new job with the same members,
    # and a job whose difference is no one member's
    assert member.open("first", "abc").kind == MsgType.OPENED
    assert member.open("third", "abc").kind == MsgType.OPENED
    assert member.open("fourth", "abd").kind == MsgType.OPENED
    # a refused job opened nothing, so it binds nothing; the one that ran set-up binds
    record = ledger.load(member.party.private_dir())
    assert [(e.job, "".join(e.members), e.opened) for e in record] == [
        ("first", "abc", ("setup",)), ("third", "abc", ()), ("fourth", "abd", ())]
    path = member.party.private_dir() / ledger.FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # a restarted worker reads the same ledger
    again = Member(tmp_path, PartyPolicy(protocols=("horizontal",)))
    assert again.open("fifth", "ab").kind == MsgType.ERROR
    # an operator who accepts the residue says so in its policy; the refusal becomes a warning
    lenient = Member(tmp_path, PartyPolicy(protocols=("horizontal",),
                                           horizontal_member_sets="allow"))
    lenient.steps = 100  # a new worker; the record of answered commands is the party's
    assert lenient.open("sixth", "ab").kind == MsgType.OPENED
    assert "c's alone (allowed by its policy horizontal_member_sets: allow)" in caplog.text


def test_a_member_whose_policy_asks_for_three_refuses_a_job_of_two(tmp_path: Path) -> None:
    member = Member(tmp_path, PartyPolicy(protocols=("horizontal",), horizontal_min_members=3))
    refused = member.open("pair", "ab")
    assert refused.kind == MsgType.ERROR
    assert refused.body.message == (
        "party a refuses job 'pair' of 2 members: with fewer than 3 a member learns another's "
        "row count and label sum (its policy horizontal_min_members: 3)")
    assert member.open("trio", "abc").kind == MsgType.OPENED


def test_a_damaged_ledger_is_refused_by_name(tmp_path: Path) -> None:
    member = Member(tmp_path, PartyPolicy(protocols=("horizontal",)))
    (member.party.private_dir() / ledger.FILE).write_text("{not json")
    refused = member.open("first", "abc")
    assert refused.kind == MsgType.ERROR
    assert "horizontal-jobs.json is not a ledger of horizontal jobs" in refused.body.message
