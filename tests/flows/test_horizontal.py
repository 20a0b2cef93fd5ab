"""Acceptance tests of the horizontal protocol on the embedded default: real worker processes,
the real Prefect ephemeral server, the real homo data sets.

- lossless: without differential privacy the members' model equals the centralized core's,
  trained on the union of the members' rows with the cuts the federation shares;
- quality: test AUC on default_credit_homo_test.csv within 0.005 of XGBoost ``hist`` trained on
  the pooled rows with the same parameters;
- dropout: a member whose worker is SIGKILLed mid-tree is dropped; that tree stops at the level
  it reached (it is the core's tree on all rows, cut there) and the rest of the model grows
  exactly as the centralized core grows it on the survivors' rows; below ``min_members`` the job
  fails with one line naming the silent member.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import flows.horizontal
from boosting.binning import goes_left
from boosting.fixedpoint import quantize
from boosting.grow import TreeGrower, sample_rows
from boosting.losses import base_score, gradients
from boosting.metrics import evaluate
from boosting.params import BoostParams
from boosting.train import BinnedBlock, bin_block, grow_tree, predict_blocks, train
from boosting.tree import Model, Tree, leaf_values, load_model, node_values, raw_decider
from fedboost import embedded
from fedboost.cli import main
from fedboost.joined import PooledRows, pool_members
from flows.config import HorizontalJobConfig
from flows.horizontal import MembersLost, horizontal_spec
from tests.scenarios import DATA, horizontal_config, horizontal_job
from workers import checkpoint
from workers.data import load_party_data
from workers.horizontal.draws import member_secret
from workers.keyed_draws import in_tree_rows
from workers.row_partitioned import OWNER

pytestmark = pytest.mark.usefixtures("prefect_harness")

NodeView = tuple[Any, ...]


def tree_view(tree: Tree) -> list[NodeView]:
    """A tree's structure: every node's children, feature, bin, threshold and missing side."""
    return [(n.id, "leaf") if n.is_leaf else
            (n.id, n.left, n.right, n.owner, n.feature, n.bin, n.threshold, n.missing_left)
            for n in tree.nodes]


def assert_same_tree(got: Tree, expected: Tree, where: str) -> None:
    """Identical structure; leaf values within 1e-6."""
    assert tree_view(got) == tree_view(expected), f"{where}: structure differs"
    leaves = [(a.value, b.value) for a, b in zip(got.nodes, expected.nodes) if a.is_leaf]
    np.testing.assert_allclose(*zip(*leaves), rtol=0, atol=1e-6, err_msg=where)


def members_model(out: Path, members: list[str]) -> Model:
    """The model every member saved: the same file at each."""
    files = {m: (out / m / "model.json").read_bytes() for m in members}
    first = members[0]
    for member, raw in files.items():
        assert raw == files[first], f"{member}'s model differs from {first}'s"
    return load_model(out / first / "model.json")


def params_of(config: HorizontalJobConfig) -> BoostParams:
    return BoostParams.from_dict(config.params.model_dump())


def binned_rows(pooled: PooledRows, max_bin: int) -> BinnedBlock:
    return bin_block(pooled.block, max_bin, pooled.cuts)


def margins_after(trees: tuple[Tree, ...], base: float, bins: np.ndarray,
                  max_bin: int) -> np.ndarray:
    """Margins (rows x 1) of binned rows under ``trees``, routed by bins as members route."""
    def decide(node: Any, rows: np.ndarray) -> np.ndarray:
        return goes_left(bins[rows, node.feature], node.bin, node.missing_left, max_bin)

    margin = np.full((bins.shape[0], 1), base)
    for tree in trees:
        margin[:, 0] += leaf_values(tree, bins.shape[0], decide)
    return margin


def grow_centrally(params: BoostParams, rows: BinnedBlock, y: np.ndarray, margin: np.ndarray,
                   trees: range, in_tree: Callable[[int], np.ndarray]) -> list[Tree]:
    """The centralized core's trees ``trees`` on ``rows``, from margins ``margin``, each tree
    on the rows ``in_tree(t)`` (gradients quantized over these rows, as ``train`` does)."""
    grown = []
    margin = margin.copy()
    for t in trees:
        g, h = gradients(params.objective, margin, y)
        grower = TreeGrower(params, quantize(g[:, 0], y.size), quantize(h[:, 0], y.size),
                            in_tree(t), 1)
        tree = grow_tree(params, grower, [rows], [0], 0)
        margin[:, 0] += node_values(tree)[grower.node_of_row]
        grown.append(tree)
    return grown


def member_draws(out: Path, config: HorizontalJobConfig, member: str) -> bytes:
    """The secret of ``member``'s row draws in the job run into ``out``, as the member derives
    it (``workers.horizontal.draws``: its checkpoint key, the job's digest)."""
    party = config.parties[member]
    digest = checkpoint.job_digest(horizontal_spec(config), str(party.data), party.columns)
    return member_secret((out / ".fedboost" / member / "checkpoint.key").read_bytes(), digest)


def member_samples(out: Path, config: HorizontalJobConfig,
                   members: list[str]) -> Callable[[int], np.ndarray]:
    """Rows in tree t under subsample: each member draws its own rows from its own secret
    (:func:`member_draws`), stacked in member order as ``pool_members`` stacks them."""
    p = config.params
    sizes = {m: load_party_data(m, config.parties[m].data, "id", "y",
                                 require_label=True).x.shape[0]
             for m in members}
    draws = {m: member_draws(out, config, m) for m in members}

    def in_tree(t: int) -> np.ndarray:
        return np.concatenate([in_tree_rows(draws[m], t, sizes[m], p.subsample)
                               for m in members])
    return in_tree


# -- lossless ---------------------------------------------------------------------------------


def test_default_credit_three_members_lossless_depth_4(tmp_path: Path) -> None:
    """guest, host_1, host_2 and an aggregator; subsample 1.0, depth 4: the core's ``train``
    on the union with the shared cuts grows the same trees."""
    config = horizontal_config("homo-credit-lossless", "default_credit",
                               params={"n_trees": 5, "max_depth": 4, "subsample": 1.0})
    result = embedded.train_embedded(config, tmp_path)
    assert result["n_aligned"] == 24000 and result["dropped"] == []
    assert result["members"] == ["guest", "host_1", "host_2"]
    model = members_model(tmp_path, config.members)
    pooled = pool_members(config)
    reference = train(params_of(config), [pooled.block], pooled.y, cuts=[pooled.cuts])
    assert len(model.trees) == len(reference.trees) == 5
    assert model.base_score == pytest.approx(reference.base_score, abs=1e-12)
    for t, (got, expected) in enumerate(zip(model.trees, reference.trees)):
        assert_same_tree(got, expected, f"tree {t}")
    assert max(n.id for t in model.trees for n in t.nodes) > 14, "no tree reached depth 4"
    n = len(pooled.ids)
    np.testing.assert_allclose(model.predict(raw_decider({OWNER: pooled.block.x}), n),
                               predict_blocks(reference, [pooled.block]), rtol=0, atol=1e-6)
    # the members' training metrics (row-weighted) are the union's
    union = evaluate("binary", pooled.y, predict_blocks(reference, [pooled.block]), "train")
    assert result["train_logloss"] == pytest.approx(union["train_logloss"], abs=1e-9)


def test_breast_two_members_lossless_with_subsample(tmp_path: Path) -> None:
    """guest and host, subsample 0.8 and the other tree parameters away from their defaults:
    the core grows the same trees on the union's sampled rows (each member samples its own)."""
    config = horizontal_config("homo-breast-lossless", "breast", params={
        "n_trees": 8, "max_depth": 3, "subsample": 0.8, "seed": 7, "gamma": 0.05,
        "min_child_weight": 2.0, "min_samples_leaf": 3, "reg_lambda": 2.0, "max_bin": 16})
    result = embedded.train_embedded(config, tmp_path)
    assert result["n_aligned"] == 455 and result["dropped"] == []
    model = members_model(tmp_path, config.members)
    pooled = pool_members(config)
    params = params_of(config)
    margin = np.full((pooled.y.size, 1), base_score("binary", pooled.y, 2)[0])
    reference = grow_centrally(params, binned_rows(pooled, params.max_bin), pooled.y, margin,
                               range(params.n_trees), member_samples(tmp_path, config, config.members))
    assert len(model.trees) == len(reference)
    assert all(len(tree.nodes) > 1 for tree in model.trees), "a tree without a split"
    for t, (got, expected) in enumerate(zip(model.trees, reference)):
        assert_same_tree(got, expected, f"tree {t}")
    assert not np.array_equal(member_samples(tmp_path, config, config.members)(0),
                              sample_rows(pooled.y.size, 0.8, 7, 0))  # not train()'s sample
    x = pooled.block.x
    cen = Model(model.params, model.base_score, 2, tuple(reference), model.features)
    np.testing.assert_allclose(model.predict(raw_decider({OWNER: x}), len(x)),
                               cen.predict(raw_decider({OWNER: x}), len(x)), rtol=0, atol=1e-6)


# -- quality ----------------------------------------------------------------------------------

CREDIT_TEST = DATA / "default_credit_homo_test.csv"


@pytest.fixture(scope="module")
def credit_run(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """'fedboost train' of default_credit_homo with configs/default_credit.yaml's parameters
    (30 trees, depth 3, lr 0.3, 32 bins); returns the run folder."""
    root = tmp_path_factory.mktemp("homo-credit")
    job = horizontal_job("homo-credit-quality", "default_credit", params={
        "n_trees": 30, "max_depth": 3, "learning_rate": 0.3, "max_bin": 32, "reg_lambda": 1.0,
        "min_child_weight": 1.0, "subsample": 1.0, "seed": 0})
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["train", str(root / "job.yaml"), "--out", str(root / "run")]) == 0
    return root / "run"


@pytest.mark.slow
def test_default_credit_test_auc_matches_xgboost_hist(credit_run: Path) -> None:
    import xgboost  # a test dependency (xgboost-cpu)

    from boosting.metrics import auc

    test = load_party_data("test", str(CREDIT_TEST), "id", "y", require_label=True)
    model = members_model(credit_run, ["guest", "host_1", "host_2"])
    assert len(model.trees) == 30
    federated = auc(test.y, model.predict(raw_decider({OWNER: test.x}), len(test.ids))[:, 0])
    config = horizontal_config("homo-credit-quality", "default_credit")
    pooled = pool_members(config)
    # XGBoost's native API (its XGBClassifier needs scikit-learn): the same parameters
    reference = xgboost.train({
        "tree_method": "hist", "max_depth": 3, "learning_rate": 0.3, "max_bin": 32,
        "reg_lambda": 1.0, "reg_alpha": 0.0, "gamma": 0.0, "min_child_weight": 1.0,
        "subsample": 1.0, "objective": "binary:logistic", "seed": 0, "nthread": 1},
        xgboost.DMatrix(pooled.block.x, label=pooled.y), num_boost_round=30)
    xgb = auc(test.y, reference.predict(xgboost.DMatrix(test.x)))
    print(f"default_credit_homo test AUC: federated {federated:.4f}, XGBoost hist {xgb:.4f}")
    assert abs(federated - xgb) <= 0.005, (federated, xgb)
    metrics = json.loads((credit_run / "metrics.json").read_text())
    assert metrics["dropped"] == [] and len(metrics["trees"]) == 30


@pytest.mark.slow
def test_predict_cli_scores_a_horizontal_run(credit_run: Path, tmp_path: Path) -> None:
    """``fedboost predict DIR --data MEMBER=CSV --out FILE`` gives the saved model's scores."""
    out = tmp_path / "scores.csv"
    assert main(["predict", str(credit_run), "--data", f"guest={CREDIT_TEST}",
                 "--out", str(out)]) == 0
    test = load_party_data("test", str(CREDIT_TEST), "id", "y", require_label=True)
    model = members_model(credit_run, ["guest", "host_1", "host_2"])
    lines = out.read_text().splitlines()
    rows = [line.split(",") for line in lines[1:]]
    assert [r[0] for r in rows] == list(test.ids)
    np.testing.assert_allclose(np.array([[float(v) for v in r[1:]] for r in rows]),
                               model.predict(raw_decider({OWNER: test.x}), len(test.ids)),
                               rtol=0, atol=1e-6)


# -- dropout ----------------------------------------------------------------------------------


class KillBeforeGrow:
    """SIGKILLs one member's embedded worker process just before the flow's grow step of
    (tree, depth): the member has sent that level's masked histograms and never answers again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, victim: str, tree: int,
                 depth: int) -> None:
        self.victim, self.at, self.killed = victim, (tree, depth, 0), False
        self.procs: list[Any] = []
        start_workers, grow = embedded.start_workers, flows.horizontal.grow

        def recording_start(*args: Any, **kwargs: Any) -> Any:
            procs, helpers = start_workers(*args, **kwargs)
            self.procs.extend(procs)
            return procs, helpers

        def killing_grow(job: str, members: list[str], tree: int, depth: int,
                         attempt: int, *rest: Any) -> None:
            if (tree, depth, attempt) == self.at and not self.killed:
                (proc,) = [p for p in self.procs if p.name == f"fedboost-{self.victim}"]
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(30)
                assert proc.exitcode == -signal.SIGKILL
                self.killed = True
            grow(job, members, tree, depth, attempt, *rest)

        monkeypatch.setattr(embedded, "start_workers", recording_start)
        monkeypatch.setattr(flows.horizontal, "grow", killing_grow)


def test_member_killed_mid_tree_is_dropped_the_tree_stops_and_the_rest_grow_on_the_survivors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """host_2 dies after sending tree 2's depth-1 histograms: after transport.step_timeout the
    job drops it. Tree 2's root and depth-1 sums were formed with host_2, so tree 2 is not grown
    again with fewer members (the aggregator would subtract): it stops there, its depth-2 nodes
    become leaves. Trees 0-1 are the union's, tree 2 the union's cut at depth 2, tree 3 what the
    core grows from the survivors' rows, the same cuts and trees 0-2."""
    k, survivors = 2, ["guest", "host_1"]
    job = horizontal_job("homo-credit-dropout", "default_credit",
                         params={"n_trees": 4, "max_depth": 3}, min_members=2,
                         transport={"kind": "memory", "step_timeout": 20})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    killer = KillBeforeGrow(monkeypatch, "host_2", tree=k, depth=1)
    assert main(["train", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "run")]) == 0
    assert killer.killed
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dropped"] == ["host_2"]
    assert metrics["members"] == ["guest", "host_1", "host_2"]
    assert set(metrics["member_metrics"]) == set(survivors) and len(metrics["trees"]) == 4
    assert not (tmp_path / "run" / "host_2" / "model.json").exists()
    model = members_model(tmp_path / "run", survivors)

    config = horizontal_config("homo-credit-dropout", "default_credit",
                               params={"n_trees": k, "max_depth": 3})
    union = pool_members(config)
    before = train(params_of(config), [union.block], union.y, cuts=[union.cuts])
    for t in range(k):
        assert_same_tree(model.trees[t], before.trees[t], f"tree {t} (all members)")
    everyone = binned_rows(union, 32)
    margin = margins_after(model.trees[:k], model.base_score[0], everyone.bins, 32)
    (cut,) = grow_centrally(BoostParams.from_dict({**config.params.model_dump(), "max_depth": 2}),
                            everyone, union.y, margin, range(k, k + 1),
                            lambda t: np.ones(union.y.size, dtype=bool))
    assert_same_tree(model.trees[k], cut, f"tree {k} (all members, cut at depth 2)")
    assert len(cut.nodes) > 3 and len(before.trees[1].nodes) > len(cut.nodes)
    params = BoostParams.from_dict({**config.params.model_dump(), "n_trees": 4})
    rest = pool_members(config, members=survivors)
    assert all(np.array_equal(a, b) for a, b in zip(rest.cuts, union.cuts, strict=True))
    rows = binned_rows(rest, params.max_bin)
    margin = margins_after(model.trees[:k + 1], model.base_score[0], rows.bins, params.max_bin)
    after = grow_centrally(params, rows, rest.y, margin, range(k + 1, 4),
                           lambda t: np.ones(rest.y.size, dtype=bool))
    for t, expected in enumerate(after, start=k + 1):
        assert_same_tree(model.trees[t], expected, f"tree {t} (survivors)")


def test_below_min_members_the_job_fails_naming_the_silent_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """breast_homo's two members, min_members 2: host dies mid-tree and the job fails with one
    line that names it."""
    config = horizontal_config("homo-breast-lost", "breast", params={"n_trees": 3},
                               transport={"kind": "memory", "step_timeout": 15})
    killer = KillBeforeGrow(monkeypatch, "host", tree=1, depth=0)
    with pytest.raises(MembersLost) as lost:
        embedded.train_embedded(config, tmp_path)
    assert killer.killed
    message = str(lost.value)
    assert "\n" not in message and "member(s) host did not answer" in message, message
    assert "min_members is 2" in message and "guest" not in message.split(";")[0], message
