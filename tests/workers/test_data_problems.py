"""Data problems get a clear error naming party, file and place, or a documented handling:
missing values are their own bin (see the lossless NaN tests), infinities are refused, a constant
column is never split on, one-class labels are refused, a label column at a passive party is
refused, and ids spelled differently by two parties are pointed out."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from boosting.params import BoostParams
from boosting.train import FeatureBlock, train
from fedboost.embedded import train_embedded
from flows.coordinator import PartyError
from messages.bodies import ErrorReply, Step
from messages.secureboost import OpenJob
from messages.envelope import MsgType
from tests.scenarios import DATA, config_with
from tests.workers.test_runtime import _command, _reply, _spec, _worker
from workers import DataError
from workers.data import load_party_data


def test_infinite_values_are_refused_naming_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "host.csv"
    path.write_text("id,x0,x1\na,1,2\nb,inf,3\n")
    with pytest.raises(DataError, match=r"party host: file .*host.csv: row 3, column 'x0': infinite"):
        load_party_data("host", path, "id", None, require_label=False)


def test_missing_cells_are_missing_values_not_errors(tmp_path: Path) -> None:
    path = tmp_path / "host.csv"
    path.write_text("id,x0\na,\nb,NA\nc,nan\nd,4\n")
    data = load_party_data("host", path, "id", None, require_label=False)
    assert np.isnan(data.x[:3, 0]).all() and data.x[3, 0] == 4


def test_a_constant_column_is_never_split_on() -> None:
    rng = np.random.default_rng(0)
    x = np.column_stack([np.full(400, 7.0), rng.normal(size=400)])
    y = (x[:, 1] + rng.normal(scale=0.3, size=400) > 0).astype(float)
    model = train(BoostParams(n_trees=3, max_depth=3), [FeatureBlock("guest", ("const", "x"), x)], y)
    used = {node.feature for tree in model.trees for node in tree.nodes if not node.is_leaf}
    assert used == {1}


@pytest.mark.usefixtures("prefect_harness")
def test_one_class_labels_are_refused_at_the_active_party(tmp_path: Path) -> None:
    path = tmp_path / "guest.csv"
    rows = list(csv.reader((DATA / "breast_hetero_guest.csv").open()))
    label_at = rows[0].index("y")
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(rows[0])
        writer.writerows([*r[:label_at], "1", *r[label_at + 1:]] for r in rows[1:])
    config = config_with("breast.yaml", crypto={"key_bits": 1024}, params={"n_trees": 1},
                         parties={"guest": {"role": "active", "data": str(path), "id": "id",
                                            "label": "y"},
                                  "host": {"role": "passive", "id": "id",
                                           "data": str(DATA / "breast_hetero_host.csv")}})
    with pytest.raises(PartyError, match="single class") as failure:
        train_embedded(config, tmp_path / "out")
    assert failure.value.user_error and str(path) in str(failure.value)


def test_a_label_column_at_a_passive_party_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "host.csv"
    path.write_text("id,x0,y\na,1,0\nb,2,1\n")
    worker, hub = _worker(tmp_path, path)
    worker.handle_bytes(_command(MsgType.OPEN_JOB, OpenJob(_spec(path))))
    reply = _reply(hub)
    assert isinstance(reply.body, ErrorReply) and reply.body.user_error
    assert "column 'y' has the name of the active party's label" in reply.body.message
    assert str(path) in reply.body.message
    worker.handle_bytes(_command(MsgType.PSI_BLIND, Step(), "next"))  # the worker goes on
    assert isinstance(_reply(hub).body, ErrorReply)


@pytest.mark.usefixtures("prefect_harness")
def test_ids_spelled_differently_are_pointed_out(tmp_path: Path) -> None:
    rows = list(csv.reader((DATA / "breast_hetero_host.csv").open()))
    path = tmp_path / "host.csv"
    with path.open("w", newline="") as out:  # the same customers, ids written as floats
        writer = csv.writer(out)
        writer.writerow(rows[0])
        writer.writerows([f"{float(r[0])}", *r[1:]] for r in rows[1:])
    config = config_with("breast.yaml", crypto={"key_bits": 1024}, params={"n_trees": 1},
                         parties={"guest": {"role": "active", "id": "id", "label": "y",
                                            "data": str(DATA / "breast_hetero_guest.csv")},
                                  "host": {"role": "passive", "id": "id", "data": str(path)}})
    with pytest.raises(PartyError, match="spelled the same way") as failure:
        train_embedded(config, tmp_path / "out")
    assert failure.value.user_error and "empty intersection" in str(failure.value)


def test_errors_name_rows_and_columns_but_never_ids_or_cells(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 12 item 11: the text goes to the flow and Prefect; the values stay at the party
    (its own log, at DEBUG)."""
    path = tmp_path / "host.csv"
    path.write_text("id,x0\ncustomer-17,1\ncustomer-18,secret-cell\n")
    caplog.set_level("DEBUG", logger="fedboost.worker")
    with pytest.raises(DataError) as failure:
        load_party_data("host", path, "id", None, require_label=False)
    assert "row 3, column 'x0': not a number" in str(failure.value)
    assert "secret-cell" not in str(failure.value) and "secret-cell" in caplog.text
    path.write_text("id,x0\ncustomer-17,1\ncustomer-17,2\n")
    with pytest.raises(DataError) as failure:
        load_party_data("host", path, "id", None, require_label=False)
    assert "duplicate id at rows 2 and 3" in str(failure.value)
    assert "customer-17" not in str(failure.value)
    path.write_bytes(b"id,x0\n\xff\xfe,1\n")
    with pytest.raises(DataError, match=r"not UTF-8 text \(byte 6\)") as failure:
        load_party_data("host", path, "id", None, require_label=False)
    assert "xff" not in str(failure.value)


def test_a_label_outside_the_objective_is_refused_at_open_naming_the_row(
        tmp_path: Path) -> None:
    """A 2 among a binary job's 0/1 labels, past the rows 'fedboost train' checks before the
    workers start: the active party's worker refuses the job when it loads its file (the
    OPEN_JOB step, before PSI and binning), naming file, row and column; the worker goes on."""
    from messages.envelope import Envelope
    from messages.transport import MemoryHub
    from tests.scenarios import TEST_POLICY
    from tests.workers.test_runtime import SEALERS
    from workers.party import PartySpec
    from workers.protocols import PROTOCOLS
    from workers.runtime import Worker

    rows = list(csv.reader((DATA / "default_credit_hetero_guest.csv").open()))
    label_at = rows[0].index("y")
    rows[2500][label_at] = "2"  # file row 2501 (the header is row 1)
    path = tmp_path / "guest.csv"
    with path.open("w", newline="") as out:
        csv.writer(out).writerows(rows)
    hub = MemoryHub(["host", "guest", "flow"])
    party = PartySpec("guest", "active", str(path), "id", "y", str(tmp_path / "models"),
                      policy=TEST_POLICY)
    worker = Worker(party, hub.endpoint("guest"), PROTOCOLS, SEALERS["guest"])
    worker.handle_bytes(SEALERS["flow"].seal(Envelope("job", "t", "flow", "guest",
                                                      MsgType.OPEN_JOB, OpenJob(_spec(path)))))
    reply = SEALERS["flow"].open(hub.endpoint("flow").receive(timeout=30))
    assert isinstance(reply.body, ErrorReply) and reply.body.user_error, reply.body
    assert reply.body.message == (f"party guest: file {path}: row 2501, label column 'y': 2 "
                                  f"is not 0 or 1 (objective binary); 1 row(s) like it")
    assert "job" not in worker.jobs or worker.jobs["job"].state is None
