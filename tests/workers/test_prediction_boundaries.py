"""Prediction's trust boundaries at the real workers: a passive party answers only the pairs on
the rows' paths that lie inside the job, and the active party writes scores only in its own
model folder; whatever it is sent, each worker goes on serving."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boosting.binning import goes_left_raw
from boosting.params import BoostParams
from boosting.tree import Model, Tree, TreeNode, save_model
from messages.bodies import ErrorReply, PartyInfo, Step
from messages.secureboost import DecisionRequest, OpenPrediction, PathDecisions
from messages.envelope import Envelope, Kind, MsgType
from messages.signing import federation_sealers
from messages.transport import MemoryHub
from tests.scenarios import DATA
from workers.column_partitioned.lookup import LookupRecord, lookup_to_dict
from workers.party import PartySpec
from workers.policy import PartyPolicy
from workers.protocols import PROTOCOLS
from workers.runtime import Worker

SEALERS = federation_sealers(["guest", "host"])
PARTIES = [PartyInfo("guest", "active"), PartyInfo("host", "passive")]
HOST_RECORDS = {0: LookupRecord(0, 3, 0.0, False), 1: LookupRecord(1, 5, 0.5, True),
                2: LookupRecord(0, 7, -0.3, False)}


def _plant_model(models: Path, job: str,
                 records: dict[int, LookupRecord] | None = None) -> None:
    """A trained job's parts as 'fedboost train' leaves them: two trees, nodes of both."""
    tree0 = Tree((TreeNode(0, 1, 2, "host", record_id=0), TreeNode(1, 3, 4, "guest", 0, 2, 0.1),
                  TreeNode(2, 5, 6, "host", record_id=1), TreeNode(3, value=-0.4),
                  TreeNode(4, value=0.2), TreeNode(5, value=0.3), TreeNode(6, value=0.7)))
    tree1 = Tree((TreeNode(0, 1, 2, "host", record_id=2), TreeNode(1, value=-0.1),
                  TreeNode(2, value=0.1)))
    model = Model(BoostParams(n_trees=2), (0.0,), 2, (tree0, tree1),
                  {"guest": ("x0", "x1"), "host": ("x0", "x1")})
    save_model(model, models / job / "guest" / "model.json")
    (models / job / "host").mkdir(parents=True)
    (models / job / "host" / "lookup.json").write_text(json.dumps(
        lookup_to_dict("host", job, ("x0", "x1"), records or HOST_RECORDS)))


class Federation:
    """A real guest and host worker on in-memory queues; the test is the flow."""

    def __init__(self, models: Path, host_policy: PartyPolicy = PartyPolicy()) -> None:
        self.session = uuid.uuid4().hex[:12]  # workers remember answered tasks across restarts
        self.hub = MemoryHub(["guest", "host", "flow"])
        self.flow = self.hub.endpoint("flow")
        self.workers = {
            name: Worker(PartySpec(name, role, str(DATA / f"breast_hetero_{name}.csv"), "id",
                                   "y" if role == "active" else None,
                                   str(models / "{job}" / name),
                                   policy=host_policy if name == "host" else PartyPolicy()),
                         self.hub.endpoint(name), PROTOCOLS, SEALERS[name])
            for name, role in (("guest", "active"), ("host", "passive"))}

    def send(self, sender: str, recipient: str, kind: Kind, body: object, task: str) -> None:
        env = Envelope("job", f"{self.session}/{task}", sender, recipient, kind, body)
        self.workers[recipient].handle_bytes(SEALERS[sender].seal(env))

    def call(self, parties: list[str], kind: Kind, body: object, task: str,
             *, pump: tuple[str, ...] = ("guest", "host")) -> dict[str, Envelope]:
        """Send a command and pass peer messages between the workers until all answered."""
        for party in parties:
            self.send("flow", party, kind, body, task)
        replies: dict[str, Envelope] = {}
        for _ in range(500):
            self.pump(pump)
            data = self.flow.receive(timeout=0.01)
            if data is not None:
                env = SEALERS["flow"].open(data)
                replies[env.sender] = env
            if len(replies) == len(parties):
                return replies
        raise AssertionError(f"no answer to {kind.name} from {set(parties) - set(replies)}")

    def pump(self, names: tuple[str, ...]) -> None:
        for name in names:
            worker = self.workers[name]
            data = worker.transport.receive(timeout=0.01)
            if data is not None:
                worker.handle_bytes(data)

    def open_and_align(self, scores_file: str = "scores.csv") -> None:
        opened = self.call(["guest", "host"], MsgType.OPEN_PREDICTION,
                           OpenPrediction(PARTIES, 100, scores_file, "trained"), "open")
        assert all(r.kind == MsgType.ACK for r in opened.values()), opened
        self.call(["guest", "host"], MsgType.PSI_BLIND, Step(), "blind")
        self.call(["host"], MsgType.PSI_REBLIND, Step(), "reblind")
        self.call(["guest"], MsgType.PSI_INTERSECT, Step(), "intersect")


@pytest.fixture
def federation(tmp_path: Path) -> Federation:
    _plant_model(tmp_path, "trained")
    return Federation(tmp_path)


def _request(rows: list[int], records: list[int], depth: int = 0) -> DecisionRequest:
    return DecisionRequest(0, depth, np.array(rows, dtype="<u4").tobytes(),
                           np.array(records, dtype="<u4").tobytes())


def _host_answers(fed: Federation, request: DecisionRequest, task: str) -> Envelope:
    """A (hostile) active party's request and the flow's command to the host."""
    fed.send("guest", "host", MsgType.DECISION_REQUEST, request, f"req-{task}")
    return fed.call(["host"], MsgType.TRAVERSE_LEVEL, Step(0, request.depth), task,
                    pump=("host",))["host"]  # the guest's inbox keeps what the host sent


def test_a_passive_party_refuses_pairs_outside_the_job_and_keeps_serving(
        federation: Federation) -> None:
    federation.open_and_align()
    hostile = {
        "row outside the batch": _request([100], [0]),
        "record it does not own": _request([0], [9]),
        "the same pair twice": _request([1, 1], [0, 0]),
        "more pairs than rows x records": _request([0] * 301, [0] * 301),
        "rows and records of different lengths": DecisionRequest(0, 1, b"\0" * 8, b"\0" * 4),
        "a level no tree has": _request([0], [0], depth=16),
    }
    expected = {"row outside the batch": "row 100 is outside the batch of 100",
                "record it does not own": "record 9 is not one of this party's",
                "the same pair twice": "a (row, record) pair is asked twice",
                "more pairs than rows x records": "301 pairs, more than the batch's 100 rows",
                "rows and records of different lengths": "uint32 arrays of one length",
                "a level no tree has": "level 16 is outside 0..15"}
    for k, (what, request) in enumerate(hostile.items()):
        reply = _host_answers(federation, request, f"bad{k}")
        assert isinstance(reply.body, ErrorReply), what
        assert expected[what] in reply.body.message, (what, reply.body.message)
    assert federation.workers["guest"].transport.receive(timeout=0.2) is None  # nothing leaked
    # still serving: an in-bounds request is answered, exactly the pairs asked
    reply = _host_answers(federation, _request([3, 0, 7], [1, 0, 2], depth=2), "good")
    assert reply.kind == MsgType.ACK and reply.body.count == 3
    data = federation.workers["guest"].transport.receive(timeout=5)
    answer = SEALERS["guest"].open(data)
    assert answer.kind == MsgType.PATH_DECISIONS
    body: PathDecisions = answer.body
    assert (body.batch, body.depth, body.n_pairs) == (0, 2, 3)
    state = federation.workers["host"].jobs["job"].state
    x = state.score_x[:100]
    want = [goes_left_raw(x[r:r + 1, HOST_RECORDS[rec].feature], HOST_RECORDS[rec].threshold,
                          HOST_RECORDS[rec].missing_left)[0] for r, rec in ((3, 1), (0, 0), (7, 2))]
    got = np.unpackbits(np.frombuffer(body.bits, dtype=np.uint8), count=3).astype(bool)
    assert got.tolist() == want


@pytest.mark.parametrize("name", ["../../etc/x", "/etc/x", "..", "sub/scores.csv", ""])
def test_scores_go_only_into_the_model_folder(federation: Federation, name: str,
                                              tmp_path: Path) -> None:
    refused = federation.call(["guest"], MsgType.OPEN_PREDICTION,
                              OpenPrediction(PARTIES, 100, name, "trained"), "open-bad")["guest"]
    assert isinstance(refused.body, ErrorReply)
    assert "must be a plain file name" in refused.body.message, refused.body.message
    bad_job = federation.call(["guest"], MsgType.OPEN_PREDICTION,
                              OpenPrediction(PARTIES, 100, "s.csv", "../../etc"), "open-job")
    assert "is not a job name" in bad_job["guest"].body.message
    # the worker goes on: a whole path-mode prediction, scores in the model folder only
    federation.open_and_align("scores.csv")
    depth = 0
    while True:
        replies = federation.call(["guest", "host"], MsgType.TRAVERSE_LEVEL, Step(0, depth),
                                  f"level{depth}")
        assert all(r.kind == MsgType.ACK for r in replies.values()), replies
        if replies["guest"].body.count == 0:
            break
        depth += 1
    assert depth == 1  # tree 0 has two levels of splits (0 and 1), tree 1 one
    for batch in range(1, 6):
        for level in range(3):
            replies = federation.call(["guest", "host"], MsgType.TRAVERSE_LEVEL,
                                      Step(batch, level), f"b{batch}l{level}")
            if replies["guest"].body.count == 0:
                break
    written = federation.call(["guest"], MsgType.WRITE_SCORES, Step(), "write")["guest"]
    assert written.kind == MsgType.ACK and written.body.count == 569
    scores = tmp_path / "trained" / "guest" / "scores.csv"
    assert scores.stat().st_mode & 0o777 == 0o600
    lines = scores.read_text().splitlines()
    assert lines[0] == "id,score" and len(lines) == 570
    assert all(0 < float(line.split(",")[1]) < 1 and not math.isnan(float(line.split(",")[1]))
               for line in lines[1:])
    assert not (tmp_path / "etc").exists()


def test_a_passive_party_answers_batched_prediction_only_if_its_policy_says_so(
        tmp_path: Path) -> None:
    _plant_model(tmp_path, "trained")
    strict = Federation(tmp_path)  # a worker's default policy: path mode only
    strict.open_and_align()
    refused = strict.call(["host"], MsgType.EVALUATE_NODES, Step(0), "batched")["host"]
    assert isinstance(refused.body, ErrorReply)
    assert "answers path-mode prediction only (policy.predict_modes)" in refused.body.message
    assert strict.workers["guest"].transport.receive(timeout=0.2) is None  # no decisions sent
    lenient = Federation(tmp_path, PartyPolicy(predict_modes=("path", "batched")))
    lenient.open_and_align()
    answered = lenient.call(["host"], MsgType.EVALUATE_NODES, Step(0), "batched",
                            pump=("host",))["host"]
    assert answered.kind == MsgType.ACK and answered.body.count == 100


def test_a_passive_party_answers_no_more_decisions_per_row_than_a_path_has(
        tmp_path: Path) -> None:
    """Outside the model: an active party that lies about where its rows are asks, at one
    level, for every (row, record) pair. Records that know their tree and level (lookup files
    written since they keep them) are answered only at their level, one per tree and row, each
    level once: a row's decisions can be no more than its path's, though at nodes of the
    active party's choosing."""
    shaped = {0: replace(HOST_RECORDS[0], tree=0, depth=0),
              1: replace(HOST_RECORDS[1], tree=0, depth=1),
              2: replace(HOST_RECORDS[2], tree=1, depth=0),
              3: LookupRecord(1, 2, 0.1, False, tree=0, depth=1)}  # a sibling's split
    _plant_model(tmp_path, "trained", shaped)
    fed = Federation(tmp_path)
    fed.open_and_align()
    every = [(r, rec) for r in range(100) for rec in shaped]
    refused = _host_answers(fed, _request([r for r, _ in every], [c for _, c in every]), "all")
    assert isinstance(refused.body, ErrorReply)
    assert "record 1 splits level 1, not 0" in refused.body.message
    both = _host_answers(fed, _request([5, 5], [1, 3], depth=1), "siblings")
    assert isinstance(both.body, ErrorReply)
    assert "row 5 is asked about two records of one tree at one level" in both.body.message
    assert fed.workers["guest"].transport.receive(timeout=0.2) is None  # nothing answered

    roots = _host_answers(fed, _request(list(range(100)) * 2, [0] * 100 + [2] * 100), "roots")
    assert roots.kind == MsgType.ACK and roots.body.count == 200  # one per tree and row
    assert fed.workers["guest"].transport.receive(timeout=5) is not None
    again = _host_answers(fed, _request([0], [0]), "again")
    assert isinstance(again.body, ErrorReply)
    assert "level 0: that level was answered already, for other pairs" in again.body.message
    sibling = _host_answers(fed, _request(list(range(100)), [3] * 100, depth=1), "level1")
    assert sibling.kind == MsgType.ACK  # which node of the level: the active party's choice


def test_an_honest_path_walk_is_answered_with_shaped_records(tmp_path: Path) -> None:
    shaped = {0: replace(HOST_RECORDS[0], tree=0, depth=0),
              1: replace(HOST_RECORDS[1], tree=0, depth=1),
              2: replace(HOST_RECORDS[2], tree=1, depth=0)}
    _plant_model(tmp_path, "trained", shaped)
    fed = Federation(tmp_path)
    fed.open_and_align()
    for batch in range(6):
        for depth in range(3):
            replies = fed.call(["guest", "host"], MsgType.TRAVERSE_LEVEL, Step(batch, depth),
                               f"b{batch}l{depth}")
            assert all(r.kind == MsgType.ACK for r in replies.values()), replies
            if replies["guest"].body.count == 0:
                break
    written = fed.call(["guest"], MsgType.WRITE_SCORES, Step(), "write")["guest"]
    assert written.kind == MsgType.ACK and written.body.count == 569


def test_a_passive_party_answers_a_row_one_path_across_prediction_jobs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Outside the model: the per-job bound (one record per row, tree and level) left more
    prediction jobs over the same rows, each asking another node of a level, which collect
    every decision (issue 36: 4 jobs, 3,983 of 3,983). The passive party's ledger keeps, per
    model, the record it answered for each (row, tree, level) in any prediction job, and
    refuses another; the same path again (scoring a row twice) is answered."""
    shaped = {0: replace(HOST_RECORDS[0], tree=0, depth=0),
              1: replace(HOST_RECORDS[1], tree=0, depth=1),
              2: replace(HOST_RECORDS[2], tree=1, depth=0),
              3: LookupRecord(1, 2, 0.1, False, tree=0, depth=1)}  # a sibling's split
    _plant_model(tmp_path, "trained", shaped)
    rows = list(range(100))
    released: set[tuple[int, int]] = set()
    for job, record in enumerate((1, 3, 1)):  # three prediction jobs over the same rows
        fed = Federation(tmp_path)
        fed.open_and_align()
        with caplog.at_level("WARNING", logger="fedboost.worker"):
            reply = _host_answers(fed, _request(rows, [record] * 100, depth=1), f"job{job}")
        if reply.kind == MsgType.ACK:
            assert fed.workers["guest"].transport.receive(timeout=5) is not None
            released |= {(r, record) for r in rows}
        else:
            assert isinstance(reply.body, ErrorReply)
            assert "refused: row " in reply.body.message and "was answered at tree 0 level " \
                "1 about another record in an earlier prediction job of this model" \
                in reply.body.message and "(100 such pairs" in reply.body.message
            assert fed.workers["guest"].transport.receive(timeout=0.2) is None  # nothing sent
            assert any("earlier prediction job" in r.getMessage() for r in caplog.records)
    # before the ledger: 200 of the 200 level-1 decisions of these rows; now one path's worth
    assert len(released) == 100 and {rec for _, rec in released} == {1}
    ledger = tmp_path / ".fedboost" / "host" / "released" / "trained.npz"
    assert ledger.stat().st_mode & 0o777 == 0o600
    ids = fed.workers["host"].jobs["job"].state.data.ids[:100]
    assert not any(i.encode() in ledger.read_bytes() for i in ids if len(i) > 3)  # no id kept
    # other rows of the same model are still answered, at the node the active party picks
    fed = Federation(tmp_path)
    fed.open_and_align()
    fed.send("guest", "host", MsgType.DECISION_REQUEST,
             DecisionRequest(1, 1, np.arange(100, dtype="<u4").tobytes(),
                             np.full(100, 3, dtype="<u4").tobytes()), "req-other")
    other = fed.call(["host"], MsgType.TRAVERSE_LEVEL, Step(1, 1), "other", pump=("host",))
    assert other["host"].kind == MsgType.ACK and other["host"].body.count == 100
