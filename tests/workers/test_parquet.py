"""Data formats: Parquet beside CSV (the same model), a stray text column in one line, and
categorical columns encoded by the party that owns them, in training and in prediction."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import yaml

import fedboost
from workers import DataError
from workers.data import encode_categories, load_categories, load_party_data
from tests.scenarios import CONFIGS, DATA

PARTS = ("guest/model.json", "host/lookup.json")
BANDS = ("delta", "alpha", "charlie", "bravo")
"""Category names whose sorted order (alpha, bravo, charlie, delta) is not their order here."""


def _job(guest: Path, host: Path, **host_extra: Any) -> dict[str, Any]:
    raw = yaml.safe_load((CONFIGS / "breast.yaml").read_text())
    raw["parties"]["guest"]["data"] = str(guest)
    raw["parties"]["host"] = {**raw["parties"]["host"], "data": str(host), **host_extra}
    raw["crypto"]["key_bits"] = 1024
    raw["params"]["n_trees"] = 3
    return raw


def _to_parquet(source: Path, target: Path) -> Path:
    """The CSV file as Parquet, with the types Arrow infers (integer ids, float features)."""
    table = pa_csv.read_csv(source)
    assert pa.types.is_integer(table.schema.field("id").type)
    pq.write_table(table, target)
    return target


def _with_band(tmp_path: Path, name: str, band: list[str]) -> Path:
    """The breast host file with one more column, ``band``."""
    rows = list(csv.reader((DATA / "breast_hetero_host.csv").open()))
    out = tmp_path / name
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*rows[0], "band"])
        writer.writerows([*r, b] for r, b in zip(rows[1:], band, strict=True))
    return out


def _bands() -> list[str]:
    """A text column the label largely decides (so the trees split on it), as the host holds
    it: one of four names per row, a few rows empty."""
    guest = {r["id"]: r["y"] for r in csv.DictReader((DATA / "breast_hetero_guest.csv").open())}
    host_ids = [r["id"] for r in csv.DictReader((DATA / "breast_hetero_host.csv").open())]
    rng = np.random.default_rng(0)
    bands = []
    for k, ident in enumerate(host_ids):
        base = 2 * int(guest[ident]) + int(rng.random() < 0.5)
        bands.append("" if k % 50 == 7 else BANDS[base if rng.random() > 0.1 else 3 - base])
    return bands


@pytest.mark.usefixtures("prefect_harness")
def test_parquet_and_csv_inputs_give_the_same_model(tmp_path: Path) -> None:
    guest, host = DATA / "breast_hetero_guest.csv", DATA / "breast_hetero_host.csv"
    from_csv = fedboost.train(_job(guest, host), out=tmp_path / "csv")
    from_parquet = fedboost.train(_job(_to_parquet(guest, tmp_path / "guest.parquet"),
                                       _to_parquet(host, tmp_path / "host.pq")),
                                  out=tmp_path / "parquet")
    for part in PARTS:
        assert (tmp_path / "csv" / part).read_bytes() == (tmp_path / "parquet" / part).read_bytes()
    assert from_csv.final_metrics == from_parquet.final_metrics


def test_a_stray_text_column_is_one_line_naming_file_and_column(tmp_path: Path) -> None:
    host = _to_parquet(_with_band(tmp_path, "host.csv", _bands()), tmp_path / "host.parquet")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(
        _job(DATA / "breast_hetero_guest.csv", host)))
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-m", "fedboost.cli", "train", "job.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("fedboost: error:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("fedboost: error: party host: file ")
    assert str(host) in errors[0] and "column 'band'" in errors[0]
    assert "categorical: [band]" in errors[0] and "Traceback" not in done.stderr
    for value in BANDS:  # the cells stay at the party
        assert value not in done.stderr


def test_loader_reads_both_formats_alike(tmp_path: Path) -> None:
    csv_file = tmp_path / "host.csv"
    csv_file.write_text("id,x,kind\n7,1.5,b\n8,,a\n9,NA,\n10,2,b\n")
    table = pa.table({"id": pa.array([7, 8, 9, 10]), "x": pa.array([1.5, None, None, 2.0]),
                      "kind": pa.array(["b", "a", None, "b"]).dictionary_encode()})
    parquet_file = tmp_path / "host.parquet"
    pq.write_table(table, parquet_file)
    for path in (csv_file, parquet_file):
        with pytest.raises(DataError, match=r"column 'kind': not a number; .*'categorical: "
                                            r"\[kind\]'.* or dropped"):
            load_party_data("host", path, "id", None, require_label=False)
        data = load_party_data("host", path, "id", None, require_label=False,
                               categorical=["kind"])
        assert data.ids == ["7", "8", "9", "10"] and data.names == ("x", "kind")
        np.testing.assert_array_equal(data.x, [[1.5, 1], [np.nan, 0], [np.nan, np.nan], [2, 1]])
        assert data.categories == {"kind": ("a", "b")}
        fixed = load_party_data("host", path, "id", None, require_label=False,
                                categories={"kind": ("b", "c")})  # a model's codes: a unseen
        np.testing.assert_array_equal(fixed.x[:, 1], [0, np.nan, np.nan, 0])
    with pytest.raises(DataError, match="categorical column.* x2 are not among"):
        load_party_data("host", csv_file, "id", None, require_label=False,
                        categorical=["x2"])
    pq.write_table(pa.table({"id": pa.array([1.0, 2.0]), "x": pa.array([1.0, 2.0])}),
                   tmp_path / "float_ids.parquet")
    with pytest.raises(DataError, match="id column 'id' holds floating-point numbers"):
        load_party_data("host", tmp_path / "float_ids.parquet", "id", None, require_label=False)
    big = 2**62 + 1  # exact as text, where float64 would round it
    pq.write_table(pa.table({"id": pa.array([big]), "x": pa.array([1.0])}), tmp_path / "b.pq")
    assert load_party_data("host", tmp_path / "b.pq", "id", None,
                           require_label=False).ids == [str(big)]


def test_codes_are_the_sorted_distinct_values() -> None:
    codes, categories = encode_categories(["b", " a", "", "NA", "c", "b"])
    assert categories == ("a", "b", "c")
    np.testing.assert_array_equal(codes, [1, 0, np.nan, np.nan, 2, 1])


@pytest.mark.usefixtures("prefect_harness")
def test_categorical_columns_train_and_predict_as_their_codes(tmp_path: Path) -> None:
    """A declared text column trains the model its codes (sorted distinct values) give as
    numbers, and prediction codes new rows with the saved categories (unseen: missing)."""
    bands = _bands()
    order = sorted(set(BANDS))
    text_file = _with_band(tmp_path, "host_text.csv", bands)
    codes_file = _with_band(tmp_path, "host_codes.csv",
                            [str(order.index(b)) if b else "" for b in bands])
    guest = DATA / "breast_hetero_guest.csv"
    as_text = fedboost.train(_job(guest, text_file, categorical=["band"]), out=tmp_path / "text")
    fedboost.train(_job(guest, codes_file), out=tmp_path / "codes")
    for part in PARTS:
        assert (tmp_path / "text" / part).read_bytes() == (tmp_path / "codes" / part).read_bytes()
    assert load_categories(tmp_path / "text" / "host") == {"band": tuple(order)}
    assert not (tmp_path / "codes" / "host" / "categories.json").exists()
    assert not (tmp_path / "text" / "guest" / "categories.json").exists()  # the host's alone
    assert "alpha" not in (tmp_path / "text" / "guest" / "model.json").read_text()
    host_part = fedboost.inspect(tmp_path / "text", party="host").parts[0]
    band_records = [r for r in host_part.records if r.feature == "band"]
    assert band_records and host_part.categories == {"band": 4}
    assert all(r.left_categories == order[:int(r.threshold) + 1] for r in band_records)
    assert "band in {alpha" in fedboost.inspect(tmp_path / "text").text()

    central = fedboost.centralized(_job(guest, text_file, categorical=["band"]),
                                   out=tmp_path / "central-text")
    fedboost.centralized(_job(guest, codes_file), out=tmp_path / "central-codes")
    assert (tmp_path / "central-text" / "model.json").read_bytes() == \
        (tmp_path / "central-codes" / "model.json").read_bytes()
    assert central.n_trees == 3

    unseen = ["echo" if k % 3 == 0 else b for k, b in enumerate(bands)]  # not in training
    new_text = _with_band(tmp_path, "new_text.csv", unseen)
    new_codes = _with_band(tmp_path, "new_codes.csv",
                           ["" if b == "echo" or not b else str(order.index(b)) for b in unseen])
    text_scores = fedboost.predict(as_text.run_dir, {"host": new_text},
                                   out=tmp_path / "text.csv")
    codes_scores = fedboost.predict(tmp_path / "codes", {"host": new_codes},
                                    out=tmp_path / "codes.csv")
    assert text_scores.scores_file is not None and codes_scores.scores_file is not None
    assert text_scores.scores_file.read_bytes() == codes_scores.scores_file.read_bytes()
