"""SimFL against its own parties (issue 23, items 3 and 4), on one recorded run of breast_homo's
two hospitals: a builder names no label of the other member from the gradient sums it
receives, and guesses them no better than without the sums; the aggregator cannot rebuild the
hash functions from the job spec, and their secret crosses only sealed, member to member.

Each attack (``benchmarks.simfl_privacy``) also runs on what the protocol would have shown
without its defence (the exact sums; the true functions), so the test fails if the attack
itself stops working."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.simfl_privacy import (
    Recording,
    attack_job,
    best_guesses,
    builder_view,
    exact_labels,
    invert_hashes,
    record,
    simfl_job,
)
from flows.config import SimflJobConfig
from messages.codec import to_wire
from messages.envelope import MsgType
from tests.scenarios import DATA, fixed_checkpoint_keys
from workers.data import PartyData, load_party_data
from workers.simfl.preprocess import lsh_of
from workers.simfl.privacy import derive_key

MEMBERS = ("guest", "host")
PAIRS = [("guest", "host"), ("host", "guest")]


@pytest.fixture(scope="module")
def run(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[Recording, Path, dict[str, PartyData]]:
    out = tmp_path_factory.mktemp("simfl-privacy")
    # fixed keys: the members' functions, and so how well they invert (one dimension is
    # missing), are the same every run
    fixed_checkpoint_keys(out, MEMBERS, first=1)
    parties: dict[str, Any] = {m: {"role": "member", "data": str(DATA / f"breast_homo_{m}.csv"),
                                   "id": "id", "label": "y"} for m in MEMBERS}
    parties["aggregator"] = {"role": "aggregator"}
    config = SimflJobConfig.model_validate({
        "job": "simfl-privacy", "protocol": "simfl", "parties": parties,
        "params": {"n_trees": 6, "max_depth": 4, "learning_rate": 0.3, "max_bin": 32,
                   "objective": "binary", "seed": 0, "lsh": {"r": 4.0, "seed": 3}}})
    rec, _ = record(config, out)
    rows = {m: load_party_data(m, DATA / f"breast_homo_{m}.csv", "id", "y", require_label=True)
            for m in MEMBERS}
    return rec, out, rows


def test_a_builder_names_no_label_of_the_other_member(run: tuple[Any, Path, Any]) -> None:
    rec, _, rows = run
    for builder, sender in PAIRS:
        view = builder_view(rec, builder, sender, rows[builder].x, rows[sender].y)
        found = exact_labels(view)
        assert found["claimed"] == found["correct"] == 0, (builder, found)
        assert len(view.sums) == 3 and all(g.size == rows[builder].y.size
                                           for g, _ in view.sums.values())
        # the attack on the sums the paper sends, at tree 0: labels of whole handles
        assert exact_labels(_exact_tree_0(view))["correct"] >= 50, builder


def _exact_tree_0(view: Any) -> Any:
    """The view with tree 0's sums as the paper's protocol sends them (no noise)."""
    p0 = 1.0 / (1.0 + np.exp(-view.base))
    g = np.array([np.sum(p0 - r) for r in view.rows_of])
    h = np.array([r.size * p0 * (1 - p0) for r in view.rows_of])
    return replace(view, sums={0: (g, h)})


def test_the_sums_guess_labels_no_better_than_without_them(run: tuple[Any, Path, Any]) -> None:
    rec, _, rows = run
    guesses = [best_guesses(builder_view(rec, b, s, rows[b].x, rows[s].y)) for b, s in PAIRS]
    assert sum(g["single_rows"] for g in guesses) >= 100  # rows alone under a builder row
    for g in guesses:
        assert g["one_tree_advantage"] <= 0.1 and g["all_trees_advantage"] <= 0.1, g
    # on the paper's exact sums, the same guess is right on every such row
    view = builder_view(rec, "guest", "host", rows["guest"].x, rows["host"].y)
    exact = best_guesses(replace(_exact_tree_0(view), label_sd=0.0, tree_sd=0.0))
    assert exact["one_tree_accuracy"] == 1.0, exact


def test_the_aggregator_cannot_rebuild_the_hash_functions(run: tuple[Any, Path, Any]) -> None:
    rec, out, rows = run
    spec = rec.bodies(MsgType.S_OPEN_JOB, recipient="aggregator")[0].spec
    secret = _functions_secret(rec, out)
    for member in MEMBERS:
        x = rows[member].x
        from_spec = invert_hashes(rec, "aggregator", member, x)
        assert from_spec["hash_agreement"] < 0.5, from_spec
        assert abs(from_spec["median_correlation"]) < 0.3, from_spec
        # with the members' secret (which reads the bucket ids back into hash values) and
        # functions, the same inversion finds the features (with L = d - 1 functions one
        # direction is missing: 0.2-0.84 over random secrets, 0.69-0.70 with these keys)
        true = invert_hashes(rec, "aggregator", member, x, lsh_of(spec, x.shape[1], secret),
                             secret)
        assert true["hash_agreement"] == 1.0 and true["median_correlation"] > 0.5, true


def _functions_secret(rec: Recording, out: Path) -> bytes:
    """The secret as the first member derives it (its checkpoint key, the preprocessing key)."""
    keys = sorted(k.key for k in rec.bodies(MsgType.S_PREPARE_REPLY))
    prep = hashlib.sha256("".join(keys).encode()).hexdigest()
    leader_key = (out / ".fedboost" / MEMBERS[0] / "checkpoint.key").read_bytes()
    return derive_key(leader_key, "simfl lsh secret v1", prep)


def test_the_functions_secret_travels_only_sealed_between_members(
        run: tuple[Any, Path, Any]) -> None:
    rec, out, _ = run
    secret = _functions_secret(rec, out)
    routes = {(s, r, env.kind) for s, r, env in rec.messages
              if env.kind in (MsgType.S_LSH_KEY, MsgType.S_LSH_SECRET)}
    assert routes == {("host", "guest", MsgType.S_LSH_KEY),
                      ("guest", "host", MsgType.S_LSH_SECRET)}
    for _, _, env in rec.messages:
        assert secret not in repr(to_wire(env.body)).encode() and \
            secret not in b"".join(_bytes(to_wire(env.body))), env.kind.name


def _bytes(value: Any) -> list[bytes]:
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _bytes(v)]
    return [value] if isinstance(value, bytes) else []


def test_on_adult_no_label_is_named_and_the_hash_values_do_not_invert(
        prefect_harness: None, tmp_path: Path) -> None:
    """The same attacks on Adult's unbalanced members (16,008 and 8,413 rows), 4 trees (about
    10 s on a quiet machine: the issue's headline numbers were measured there)."""
    config, data = simfl_job("adult", tmp_path, trees=4, depth=8, lr=0.05,
                             adult=DATA / "adult.csv.gz")
    report = attack_job(config, data, tmp_path / "run")
    for pair, found in report["builders"].items():
        # noisy sums that happen to land near whole numbers can make a rare claim, right or
        # wrong by chance (one wrong claim of 16,008 rows in one run); before the noise the
        # attack named 6,803 of 8,413 and 2,069 of 16,008 rows, all right
        assert found["claimed"] <= 0.001 * found["rows"], (pair, found)
        assert found["single_rows"] > 1000, pair
        assert found["one_tree_advantage"] <= 0.05 and found["all_trees_advantage"] <= 0.05, \
            (pair, found)
    for member, inverted in report["aggregator"].items():
        assert abs(inverted["median_correlation"]) < 0.1 and inverted["hash_agreement"] < 0.5, \
            (member, inverted)
