"""Scoring sessions at real workers (in-memory queues; the test is the scoring service): rows
looked up by id score as the model does on the joined rows, unknown ids come back as positions,
and a passive party takes part only if its policy allows batched answers, and only for the
active party it trained with."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from boosting.binning import goes_left_raw
from boosting.tree import TreeNode, load_model, raw_decider
from messages.bodies import ErrorReply, PartyInfo, Step
from messages.scoring import FindRows, OpenScoring, RowsFound, ScoreRows, Scores
from messages.envelope import MsgType
from tests.scenarios import DATA
from tests.workers.test_prediction_boundaries import (HOST_RECORDS, PARTIES, Federation,
                                                      _plant_model)
from workers.column_partitioned.lookup import LookupRecord, records_go_left
from workers.column_partitioned.scoring import LookupArrays
from workers.data import load_party_data
from workers.policy import PartyPolicy

BATCHED = PartyPolicy(predict_modes=("path", "batched"))


def _open(fed: Federation, task: str = "open", parties: list[PartyInfo] = PARTIES) -> dict:
    return fed.call(["guest", "host"], MsgType.OPEN_SCORING,
                    OpenScoring(parties, "trained", 64, "vertical_secureboost"), task)


def _score(fed: Federation, number: int, ids: list[str]) -> tuple[Scores, RowsFound]:
    replies = fed.call(["guest", "host"], MsgType.SCORE_ROWS, ScoreRows(number, ids, 5.0),
                       f"score/r{number}")
    return replies["guest"].body, replies["host"].body


def _expected(models: Path, ids: list[str]) -> np.ndarray:
    """The model's predictions on the joined rows, node by node (``Model.predict``): the
    guest's thresholds from its model part, the host's from its lookup table."""
    model = load_model(models / "trained" / "guest" / "model.json")
    blocks = {}
    for party in ("guest", "host"):
        data = load_party_data(party, DATA / f"breast_hetero_{party}.csv", "id",
                              "y" if party == "guest" else None, require_label=False)
        where = {ident: k for k, ident in enumerate(data.ids)}
        blocks[party] = data.x[[where[i] for i in ids]][:, :2]
    own = raw_decider(blocks)

    def decide(node: TreeNode, rows: np.ndarray) -> np.ndarray:
        if node.owner == "guest":
            return own(node, rows)
        record = HOST_RECORDS[node.record_id]
        return goes_left_raw(blocks["host"][rows, record.feature], record.threshold,
                             record.missing_left)

    return model.predict(decide, len(ids))


def test_a_session_scores_rows_by_id_as_the_model_does(tmp_path: Path) -> None:
    _plant_model(tmp_path, "trained")
    fed = Federation(tmp_path, BATCHED)
    opened = _open(fed)
    assert all(r.kind == MsgType.ACK and r.body.count == 569 for r in opened.values()), opened
    ids = load_party_data("guest", DATA / "breast_hetero_guest.csv", "id", "y",
                         require_label=False).ids
    for number, chosen in enumerate((ids[:64], ids[100:101], [ids[7], ids[7], ids[3]]), 1):
        scores, found = _score(fed, number, chosen)
        assert found == RowsFound(number, [])
        assert (scores.round, scores.n_outputs, scores.unknown) == (number, 1, [])
        got = np.frombuffer(scores.values, dtype="<f8").reshape(len(chosen), 1)
        assert np.array_equal(got, _expected(tmp_path, chosen))
    # unknown ids: their positions, from every party that lacks them; no values at all
    scores, found = _score(fed, 9, [ids[0], "no-such-id", ids[1], "nor-this"])
    assert found.unknown == [1, 3] and scores.unknown == [1, 3]
    assert scores.values == b"" and scores.incomplete == ["host"]
    # and the session goes on
    scores, _ = _score(fed, 10, ids[:2])
    assert len(scores.values) == 16
    closed = fed.call(["guest", "host"], MsgType.CLOSE_JOB, Step(), "close")
    assert all(r.kind == MsgType.ACK for r in closed.values())
    assert "job" not in fed.workers["host"].jobs


def test_a_membership_round_answers_positions_and_sends_the_active_party_nothing(
        tmp_path: Path) -> None:
    _plant_model(tmp_path, "trained")
    fed = Federation(tmp_path, BATCHED)
    _open(fed)
    ids = load_party_data("host", DATA / "breast_hetero_host.csv", "id", None,
                          require_label=False).ids
    found = fed.call(["host"], MsgType.FIND_ROWS, FindRows(1, [ids[4], "no-such", ids[9]]),
                     "find/r1", pump=("host",))["host"]
    assert found.kind == MsgType.ROWS_FOUND and found.body == RowsFound(1, [1])
    assert fed.workers["guest"].transport.receive(timeout=0.05) is None  # no decisions
    found = fed.call(["guest"], MsgType.FIND_ROWS, FindRows(2, ["no-such", ids[0]]),
                     "find/r2", pump=("guest",))["guest"]
    assert found.body == RowsFound(2, [0])
    pings = fed.call(["guest", "host"], MsgType.FIND_ROWS, FindRows(3, []), "ping")
    assert [p.body for p in pings.values()] == [RowsFound(3, [])] * 2
    too_many = fed.call(["host"], MsgType.FIND_ROWS, FindRows(4, ["x"] * 65), "find/r4",
                        pump=("host",))["host"].body
    assert isinstance(too_many, ErrorReply) and "at most 64 rows, not 65" in too_many.message


def test_a_passive_party_without_batched_in_its_policy_refuses_in_one_line(
        tmp_path: Path) -> None:
    _plant_model(tmp_path, "trained")
    fed = Federation(tmp_path)  # the default policy: path mode only
    refused = _open(fed)["host"].body
    assert isinstance(refused, ErrorReply) and refused.user_error
    assert refused.message == (
        "party host refuses the scoring service: it would send all its decisions for every "
        "requested row to guest, and its policy (predict_modes) allows path-mode prediction "
        "only")


def test_a_passive_party_sends_decisions_only_to_its_models_active_party(
        tmp_path: Path) -> None:
    _plant_model(tmp_path, "trained")
    (tmp_path / "trained" / "host" / "party.json").write_text(json.dumps(
        {"party": "host", "role": "passive", "job": "trained", "active": "guest"}))
    fed = Federation(tmp_path, BATCHED)
    elsewhere = [PartyInfo("mallory", "active"), PartyInfo("host", "passive")]
    refused = fed.call(["host"], MsgType.OPEN_SCORING,
                       OpenScoring(elsewhere, "trained", 64, "vertical_secureboost"), "other",
                       pump=("host",))["host"].body
    assert isinstance(refused, ErrorReply)
    assert refused.message == ("party host: job trained's model was trained with active party "
                               "guest, not mallory: refused")
    assert _open(fed, "right")["host"].kind == MsgType.ACK


@pytest.mark.parametrize("ids", [[], [str(k) for k in range(65)]])
def test_a_round_of_no_rows_or_too_many_is_refused(tmp_path: Path, ids: list[str]) -> None:
    _plant_model(tmp_path, "trained")
    fed = Federation(tmp_path, BATCHED)
    _open(fed)
    replies = fed.call(["guest", "host"], MsgType.SCORE_ROWS, ScoreRows(1, ids, 0.5), "bad")
    for reply in replies.values():
        assert isinstance(reply.body, ErrorReply)
        assert f"1 to 64 rows, not {len(ids)}" in reply.body.message


def test_lookup_arrays_decide_as_records_do_flipped_or_not() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3))
    x[rng.random(x.shape) < 0.2] = np.nan
    records = {7: LookupRecord(0, 1, 0.1, True), 2: LookupRecord(2, 4, -0.3, False, flip=True),
               5: LookupRecord(1, 2, 0.5, True, flip=True)}
    table = LookupArrays.of(records)
    assert table.records == [2, 5, 7]
    assert np.array_equal(table.goes_left(x), records_go_left(x, [records[r] for r in (2, 5, 7)]))
