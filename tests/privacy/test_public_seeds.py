"""Public-seed replay for every protocol and role (issue 36, items 1 and 5).

Each check records one whole job on the embedded hub (``harness.record_training``), takes
everything one role received, and replays every integer it can see (the job spec and every
message body, ``harness.public_seeds``), mixed with the tree or ensemble number, through the
draw functions the other parties of that protocol use; the draw's outcome is compared with what
the role observes. A replay must predict nothing the role is not sent in the clear anyway
(docs/threat-model.md, "Draws": the table of every draw, its drawer and observers):

- vertical SecureBoost, passive: each tree's instance space (``TreeStart.in_tree``, subsample
  and DP dealing); on a873a89 ``params.seed`` mixed as ``[seed, tree]`` and ``[seed,
  ensemble]`` predicted every tree's rows (the active party drew them from the spec's seed);
  now they come from its own secret (``workers.vertical.draws``) and nothing predicts them;
  active: the passive party's shuffle of its ids before PSI (which id it sent k-th);
- vertical SecureBoost, the noise: a job that fixes ``privacy.seed`` is refused by the active
  party's policy unless it allows it (a873a89 ran it: the noise was the spec's);
- random forest, passive: which of its features each tree's root asks (the active party's
  keyed ``node_rng``); the bootstrap sample is the job's public draw by design, sent whole in
  the level request (the passive party checks it), so its replay shows what it is sent;
- horizontal, aggregator: each tree's root count, the sum over the members of their in-tree
  rows, is replayed in ``tests/privacy/test_horizontal_seeds.py`` (subsample and DP dealing,
  two and three members); member: a job that fixes ``privacy.seed`` is refused (a873a89 ran
  it);
- SimFL, aggregator: which rows share a bucket under each hash function (the members' LSH
  functions drawn from their shared secret; ``LshFunctions.from_seed`` of any public seed, or
  a bare seed list, gives other bucket sizes). A member sees its peer's handles (OS entropy)
  and the aggregator's ties (drawn from its own key): no seed of the spec enters either, so
  there is nothing to replay (docs/threat-model.md, "Draws").

Every job here ran on a873a89 too: the instance-space and the two noise-seed checks failed
there (each tree's rows predicted; both jobs trained), the others passed (their draws were
already secret).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from boosting.forest import draw_features, features_per_node
from boosting.privacy import PrivacyPlan, deal_rows
from flows.config import SimflJobConfig
from fedboost.embedded import train_embedded
from messages.envelope import MsgType
from messages.instance_space import decode_mask
from tests.privacy.harness import Transcript, public_seeds, record_training, replay
from tests.privacy.test_horizontal_seeds import _config
from tests.scenarios import DATA, config_with
from workers.data import load_party_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

TREES = 4
SUBSAMPLE = 0.8


def _hits_per_tree(seeds: set[int], observed: dict[int, np.ndarray], mix: dict[int, int],
                   draw: Any) -> dict[int, list[tuple[int, ...]]]:
    """Per tree, the seed lists whose ``draw(rng, tree)`` (a row mask) holds every row the
    role observed in that tree (a true replay holds them all, chance none: ``0.8^k``)."""
    return {t: replay(seeds, [[mix[t]]], lambda rng, t=t: draw(rng, t),
                      lambda mask, t=t: bool((observed[t] & ~mask).sum() == 0))
            for t in observed}


def _with_policy(config: Any, party: str, policy: dict[str, Any]) -> Any:
    """``config`` with ``party``'s own ``policy:`` (every other key the default's)."""
    raw = config.model_dump()
    raw["parties"][party]["policy"] = policy
    return type(config).model_validate(raw)


# -- vertical SecureBoost -------------------------------------------------------------------

@pytest.fixture(scope="module")
def vertical(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Transcript:
    """breast, 4 trees of depth 1, subsample 0.8 and DP (two ensembles of two)."""
    config = config_with("breast.yaml", crypto={"key_bits": 1024},
                         params={"n_trees": TREES, "max_depth": 1, "max_bin": 8,
                                 "learning_rate": 0.5, "reg_lambda": 5.0,
                                 "subsample": SUBSAMPLE},
                         privacy={"epsilon": 8.0, "clip": 0.3, "trees_per_ensemble": 2})
    return record_training(config, tmp_path_factory.mktemp("vertical-seeds"))


def _training_rows(transcript: Transcript, passive: str) -> int:
    (aligned,) = [m.body for m in transcript.of_kind(passive, MsgType.ALIGNED_ROWS)]
    n = int((np.frombuffer(aligned.positions, "<i4") >= 0).sum())
    return int((~decode_mask(aligned.valid, n)).sum())


def test_no_public_seed_predicts_a_vertical_passive_partys_instance_spaces(
        vertical: Transcript) -> None:
    config = vertical.config
    passive = config.passives[0]
    n = _training_rows(vertical, passive)
    observed = {m.body.tree: decode_mask(m.body.in_tree, n)
                for m in vertical.of_kind(passive, MsgType.TREE_START)}
    assert sorted(observed) == list(range(TREES)) and all(o.sum() > 20 for o in observed.values())
    seeds = public_seeds(vertical, passive)
    assert config.params.seed in seeds
    p = config.params
    plan = PrivacyPlan(8.0, TREES, 1, 2, 0.3, p.reg_lambda, p.learning_rate)

    subsample = _hits_per_tree(seeds, observed, {t: t for t in observed},
                               lambda rng, t: rng.random(n) < SUBSAMPLE)
    dealing = _hits_per_tree(seeds, observed, {t: plan.ensemble_of(t)[0] for t in observed},
                             lambda rng, t: deal_rows(plan, plan.ensemble_of(t)[0], n, rng)
                             == plan.ensemble_of(t)[1])
    print(f"VERTICAL-SEEDS subsample {subsample} dealing {dealing}")
    assert not any(subsample.values()), f"seeds predict the subsample: {subsample}"
    assert not any(dealing.values()), f"seeds predict the DP dealing: {dealing}"


def test_no_public_seed_predicts_the_passive_partys_id_shuffle(vertical: Transcript) -> None:
    """The active party learns which of its rows the passive party's k-th blinded id is
    (its alignment answer); a replayed shuffle would give the passive file's row of each."""
    config = vertical.config
    passive = config.passives[0]
    party = config.parties[passive]
    (aligned,) = [m.body for m in vertical.of_kind(passive, MsgType.ALIGNED_ROWS)]
    positions = np.frombuffer(aligned.positions, "<i4").astype(np.int64)
    theirs = load_party_data(passive, str(party.data), party.id, None, require_label=False).ids
    active = config.parties[config.active]
    ours = load_party_data(config.active, str(active.data), active.id, active.label,
                           require_label=True).ids
    common = sorted(set(ours) & set(theirs))
    row_of = {i: k for k, i in enumerate(theirs)}
    sent = positions >= 0
    truth = np.array([row_of[common[p]] for p in positions[sent]])  # file row of k-th id sent
    seeds = public_seeds(vertical, config.active)
    hits = replay(seeds, [], lambda rng: rng.permutation(len(theirs))[sent],
                  lambda order: bool(np.array_equal(order, truth)))
    assert not hits, hits


def test_a_job_that_fixes_the_noise_seed_is_refused_by_the_active_partys_policy(
        tmp_path: Path) -> None:
    """privacy.seed fixes the noise: whoever reads the job replays it and subtracts it from the
    split choices and leaves (a873a89 trained the job). The default policy refuses it; the
    embedded default's (experiments, benchmarks) allows it."""
    config = config_with("breast.yaml", crypto={"key_bits": 1024},
                         params={"n_trees": 1, "max_depth": 1, "max_bin": 8},
                         privacy={"epsilon": 8.0, "seed": 7})
    strict = _with_policy(config, config.active, {"min_key_bits": 1024})
    with pytest.raises(Exception, match=r"refuses a job whose privacy.seed fixes the noise"):
        train_embedded(strict, tmp_path / "strict")


# -- vertical random forest -----------------------------------------------------------------

@pytest.fixture(scope="module")
def forest(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Transcript:
    from flows.config import validate_job

    config = validate_job({
        "job": "forest-seeds", "protocol": "vertical_random_forest",
        "parties": {
            "guest": {"role": "active", "data": str(DATA / "breast_hetero_guest.csv"),
                      "id": "id", "label": "y"},
            "host": {"role": "passive", "data": str(DATA / "breast_hetero_host.csv"),
                     "id": "id"}},
        "params": {"n_trees": TREES, "max_depth": 2, "max_features": "sqrt",
                   "min_samples_leaf": 5, "max_bin": 16, "objective": "binary",
                   "bootstrap": True, "seed": 3},
        "crypto": {"key_bits": 1024}}, "forest seeds")
    return record_training(config, tmp_path_factory.mktemp("forest-seeds"))


def test_no_public_seed_predicts_the_forest_features_a_passive_party_is_asked(
        forest: Transcript) -> None:
    config = forest.config
    passive = config.passives[0]
    guest_features = load_party_data("guest", str(config.parties["guest"].data), "id", "y",
                                     require_label=True).x.shape[1]
    roots = {m.body.tree: m.body for m in forest.of_kind(passive, MsgType.F_REQUEST)
             if m.body.depth == 0}
    assert sorted(roots) == list(range(TREES)), sorted(roots)
    host_features = 20
    total = guest_features + host_features
    k = features_per_node(config.params.max_features, total)
    seeds = public_seeds(forest, passive)
    # a rule (a public seed, alone or mixed with the tree and node) that predicts the draws
    # predicts every tree's; one tree matched by chance is no rule: hundreds of integers cross
    # the wire and a root asks a few of the host's 20 features (a clean-clone run on 88e5657
    # had one public integer match one tree's root; no integer can match most trees by chance)
    asked_ever, trees_per_rule = 0, collections.Counter[tuple[int, int]]()
    for tree, request in roots.items():
        weights = np.frombuffer(request.weights, "<u2")
        first = int(np.flatnonzero(weights > 0)[0])
        asked = sorted(f for r in request.requests for f in r.features)  # root: one node
        asked_ever += bool(asked)

        def features(rng: np.random.Generator) -> list[int]:
            return [int(f) - guest_features for f in draw_features(rng, total, k)
                    if f >= guest_features]
        hits = replay(seeds, [[tree], [0], [first]], features, lambda f: f == asked and bool(f))
        trees_per_rule.update({(key[0], len(key)) for key in hits})
        # the bootstrap: the job's public draw, by design (the passive party checks it);
        # what its replay gives is what the request carries
        assert replay([config.params.seed], [[tree]],
                      lambda rng: np.bincount(rng.integers(0, weights.size, weights.size),
                                              minlength=weights.size),
                      lambda w: bool(np.array_equal(w, weights)))
    assert asked_ever >= 2, "the host was asked too rarely for the check to mean anything"
    rule, predicted = max(trees_per_rule.items(), key=lambda item: item[1], default=(None, 0))
    assert predicted <= TREES // 2, f"seed {rule} predicts {predicted}/{TREES} trees' features"


# -- horizontal -----------------------------------------------------------------------------
# the aggregator's root counts replayed: tests/privacy/test_horizontal_seeds.py (12 trees; four
# were too few: a mix without the tree number predicts one count for every tree, and 2 of 200
# null draws of four trees' counts held three equal ones that some public seed matched)

def test_a_horizontal_job_that_fixes_the_noise_seed_is_refused_by_a_member(
        tmp_path: Path) -> None:
    config = _config(tmp_path, 2, "homo-noise-seed",
                     params={"n_trees": 1, "max_depth": 1, "max_bin": 16, "seed": 0},
                     privacy={"epsilon": 1.0, "clip": 0.3, "seed": 5})
    config = _with_policy(config, config.members[0], {"protocols": ["horizontal"]})
    with pytest.raises(Exception, match=r"refuses a job whose privacy.seed fixes the noise"):
        train_embedded(config, tmp_path / "run")


# -- SimFL ----------------------------------------------------------------------------------

def _partition(values: np.ndarray) -> np.ndarray:
    """Rows x rows: which rows share a value (a function's buckets, whatever their names)."""
    return values[:, None] == values[None, :]


def test_no_public_seed_predicts_which_rows_share_a_simfl_bucket(tmp_path: Path) -> None:
    from workers.simfl.lsh import LshFunctions

    members = ("guest", "host")
    parties: dict[str, Any] = {m: {"role": "member", "data": str(DATA / f"breast_homo_{m}.csv"),
                                   "id": "id", "label": "y"} for m in members}
    parties["aggregator"] = {"role": "aggregator"}
    config = SimflJobConfig.model_validate({
        "job": "simfl-public-seeds", "protocol": "simfl", "parties": parties,
        "params": {"n_trees": 2, "max_depth": 1, "learning_rate": 0.1, "max_bin": 16,
                   "objective": "binary", "seed": 0, "lsh": {"r": 4.0, "seed": 3}}})
    transcript = record_training(config, tmp_path)
    seeds = public_seeds(transcript, "aggregator")
    assert 3 in seeds
    for member in members:
        (sent,) = [m.body for m in transcript.of_kind("aggregator", MsgType.S_ROW_HASHES)
                   if m.sender == member]
        rows = len(sent.handles) // 8
        ids = np.frombuffer(sent.hashes, "<u8").reshape(rows, sent.functions)
        handles = np.frombuffer(sent.handles, "<u8")
        x = load_party_data(member, DATA / f"breast_homo_{member}.csv", "id", "y",
                            require_label=True).x
        # the rows as the member sent them: the handles are a shuffle of its own (OS entropy);
        # a replay gives a function's partition only in the member's row order, so compare
        # the partitions' sizes (invariant to the order): the bucket sizes' multiset
        sizes = [sorted(np.unique(ids[:, k], return_counts=True)[1]) for k in range(sent.functions)]
        r = float(config.params.lsh.r)

        def buckets(rng: np.random.Generator) -> list[list[int]]:
            a = rng.standard_normal((sent.functions, x.shape[1]))
            b = rng.random(sent.functions) * r
            h = np.floor((x @ a.T + b) / r)
            return [sorted(np.unique(h[:, k], return_counts=True)[1]) for k in range(h.shape[1])]

        def predicts(found: list[list[int]]) -> bool:
            return sum(f == s for f, s in zip(found, sizes)) > sent.functions // 2

        # LshFunctions.from_seed's own stream, and a bare seed list
        from_seed = [s for s in seeds if predicts(
            [sorted(np.unique(col, return_counts=True)[1])
             for col in LshFunctions.from_seed(s, x.shape[1], sent.functions, r).hash(x).T])]
        bare = replay(seeds, [], buckets, predicts)
        assert not from_seed and not bare, (member, from_seed, bare)
        assert len(set(handles.tolist())) == rows
