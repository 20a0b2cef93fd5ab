"""The noise a SimFL member adds to the gradient sums it sends, the builder's estimate, and the
privacy the flow reports for it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flows.config import SimflJobConfig
from flows.simfl import privacy_spent
from workers.simfl.privacy import (GRID, GradientNoise, denoise, derive_key, hessian_share,
                                   standard_normal)

NOISE = GradientNoise(label=2.0, tree=4.0, g_bound=1.0, h_bound=0.25)


def test_the_keystream_gives_standard_normals_that_only_its_key_repeats() -> None:
    key = derive_key(bytes(32), "test", "a")
    draws = standard_normal(key, 200_001)
    assert draws.size == 200_001
    assert abs(draws.mean()) < 0.01 and abs(draws.std() - 1.0) < 0.01
    assert abs(np.mean(draws > 1.96) - 0.025) < 0.002  # the tail, not only the moments
    assert np.array_equal(draws[:1000], standard_normal(key, 1000))
    assert not np.allclose(draws[:1000], standard_normal(derive_key(bytes(32), "test", "b"),
                                                         1000))
    # parts are length-prefixed: ("ab", "c") and ("a", "bc") are other keys
    assert derive_key(bytes(32), "p", "ab", "c") != derive_key(bytes(32), "p", "a", "bc")


def test_every_target_row_gets_noise_on_the_grid_and_sums_are_clipped() -> None:
    g = np.array([0.5, -2.0, 0.25])
    h = np.array([0.25, 0.5, 0.1])
    g_sum, h_sum = NOISE.sums(g, h, np.array([0, 0, 2]), 4)
    assert g_sum.tolist() == [-0.5, 0.0, 0.25, 0.0]  # -2 clipped to -1; rows 1, 3 empty
    assert h_sum.tolist() == [0.5, 0.0, 0.1, 0.0]  # 0.5 clipped to 0.25
    sent_g, sent_h = NOISE.randomize(g_sum, h_sum, bytes(32), "prep/builder")
    assert (sent_g != g_sum).all() and isinstance(sent_h, float)  # empty rows too
    assert sent_h != h_sum.sum()  # one h total, no h per row
    assert np.allclose(sent_g / GRID, np.round(sent_g / GRID), rtol=0, atol=1e-9)
    assert math.isclose(sent_h / (GRID * 0.25), round(sent_h / (GRID * 0.25)), abs_tol=1e-9)


def test_the_same_sums_get_the_same_noise_and_the_label_part_persists() -> None:
    rng = np.random.default_rng(0)
    n = 50_000
    first = rng.normal(size=n), rng.random(n) / 4
    second = rng.normal(size=n), rng.random(n) / 4
    sent = NOISE.randomize(*first, bytes(32), "prep/builder")
    again = NOISE.randomize(*first, bytes(32), "prep/builder")
    assert all(np.array_equal(a, b) for a, b in zip(sent, again))  # a retry averages nothing
    later = NOISE.randomize(*second, bytes(32), "prep/builder")
    other_key = NOISE.randomize(*first, bytes([1]) * 32, "prep/builder")
    noise = [s[0] - x[0] for s, x in ((sent, first), (later, second), (other_key, first))]
    assert abs(noise[0].std() - math.hypot(2.0, 4.0)) < 0.1
    # two trees share sigma_label^2 / (sigma_label^2 + sigma_tree^2) = 0.2 of their g noise
    assert abs(np.corrcoef(noise[0], noise[1])[0, 1] - 0.2) < 0.02
    assert abs(np.corrcoef(noise[0], noise[2])[0, 1]) < 0.02  # another member's secret


def test_the_h_totals_noise_is_calibrated_to_the_jobs_trees() -> None:
    """Over T trees to one builder the h totals are together as private as one tree's: their
    noise is sqrt(T) times the per-tree scale (one row moves a total by h_max at most)."""
    job = GradientNoise(label=2.0, tree=4.0, g_bound=1.0, h_bound=0.25, trees=100)
    assert job.h_spread() == pytest.approx(10 * NOISE.h_spread()) and \
        NOISE.h_spread() == pytest.approx(4.0 * 0.25)
    g, h = np.zeros(3), np.array([0.25, 0.0, 0.1])
    drawn = np.array([job.randomize(g, h + k * 1e-3, bytes(32), "prep/builder")[1] - h.sum()
                      - k * 3e-3 for k in range(4000)])  # other exact sums: fresh noise
    assert abs(drawn.std() - 10.0) < 0.5 and abs(drawn.mean()) < 0.5
    with pytest.raises(ValueError, match="trees"):
        GradientNoise(label=2.0, tree=4.0, g_bound=1.0, h_bound=0.25, trees=0)


def test_the_builder_scales_its_own_hessians_by_the_received_total() -> None:
    rng = np.random.default_rng(3)
    own_h = rng.random(16_000) / 4
    spread = 0.25 * 8.0 * math.sqrt(250)  # the defaults, 250 trees to this builder
    # 8,000 similar rows with about the builder's hessians: half a row per builder row
    share = hessian_share(0.5 * own_h.sum() + spread * rng.normal(), spread, own_h)
    assert abs(share - 0.5) < 0.05
    assert hessian_share(spread * 0.5, spread, own_h) == 0.0  # within the noise: nothing
    assert hessian_share(-1e6, spread, own_h) == 0.0  # never below 0


def test_the_builders_estimate_is_closer_than_what_it_received() -> None:
    rng = np.random.default_rng(1)
    own = rng.normal(0.0, 0.4, 20_000)
    exact = 0.5 * own + rng.normal(0.0, 0.3, own.size)
    received = exact + rng.normal(0.0, NOISE.g_spread(), own.size)
    estimate = denoise(received, NOISE.g_spread(), own)
    assert np.mean((estimate - exact) ** 2) < 0.2 * np.mean((received - exact) ** 2)
    # pure noise: the estimate keeps (almost) nothing, never a large multiple of own
    hopeless = denoise(rng.normal(0.0, 100.0, own.size), 100.0, own)
    assert np.abs(hopeless).max() < 5.0


def _config(objective: str = "binary", members: int = 2) -> SimflJobConfig:
    parties = {f"m{k}": {"role": "member", "data": "x.csv", "id": "id", "label": "y"}
               for k in range(members)}
    return SimflJobConfig.model_validate({
        "job": "j", "protocol": "simfl", "parties": {**parties, "agg": {"role": "aggregator"}},
        "params": {"n_trees": 500, "objective": objective}})


def _epsilon(rho: float) -> float:
    return rho + 2 * math.sqrt(rho * math.log(1e5))


def test_the_reported_privacy_follows_the_zcdp_formulas() -> None:
    spent = privacy_spent(_config(), 500)
    assert spent["trees_sent"] == {"m0": 250, "m1": 250}
    sigma_l, sigma_t = spent["label_noise"], spent["tree_noise"]
    rho = 250 / (2 * (sigma_t ** 2 + 250 * sigma_l ** 2)) + 1 / (2 * sigma_t ** 2)
    assert spent["label_epsilon"]["m0"] == pytest.approx(_epsilon(rho))
    bound = _epsilon(1 / (2 * sigma_l ** 2) + 1 / (2 * sigma_t ** 2))  # whatever the trees
    assert spent["label_epsilon"]["m0"] < privacy_spent(_config(), 10**6)["label_epsilon"][
        "m0"] < bound
    assert spent["row_epsilon_per_tree"] == pytest.approx(_epsilon(2.5 / sigma_t ** 2))
    # the g sums compose over trees; the h totals' noise is calibrated to the job
    assert spent["row_epsilon"]["m1"] == pytest.approx(_epsilon((2 * 250 + 0.5) / sigma_t ** 2))
    assert spent["hessian_epsilon"] == pytest.approx(_epsilon(0.5 / sigma_t ** 2))
    assert privacy_spent(_config("regression"), 500)["label_epsilon"] is None
    assert privacy_spent(_config(members=3), 300)["trees_sent"] == {"m0": 100, "m1": 100,
                                                                    "m2": 100}


def test_each_class_has_its_own_persistent_noise() -> None:
    """Multiclass: a changed label moves one class's sums by +1 and another's by -1 in every
    tree; persistent noise shared by the classes would cancel from their difference, so each
    class's stream draws its own (binary keeps the stream it had)."""
    from workers.simfl.member import noise_stream

    assert noise_stream("prep", "b", 0, 1) == "prep/b"
    streams = [noise_stream("prep", "b", k, 4) for k in range(4)]
    assert len(set(streams)) == 4 and "prep/b" not in streams
    rng = np.random.default_rng(2)
    n = 50_000
    g, h = rng.normal(size=n), rng.random(n) / 4
    first_round = [NOISE.randomize(g, h, bytes(32), s)[0] - g for s in streams[:2]]
    later_round = [NOISE.randomize(g + 1, h, bytes(32), s)[0] - g - 1 for s in streams[:2]]
    # a class shares its persistent part across rounds (0.2 of the noise), not with another
    assert abs(np.corrcoef(first_round[0], later_round[0])[0, 1] - 0.2) < 0.02
    assert abs(np.corrcoef(first_round[0], first_round[1])[0, 1]) < 0.02
    assert abs(np.corrcoef(first_round[0], later_round[1])[0, 1]) < 0.02


def test_multiclass_privacy_counts_rounds_for_labels_and_trees_for_rows() -> None:
    """4 classes, 100 rounds between 2 members: each sends its builder 50 rounds of 4 trees.
    A label moves two classes' sums: twice one class's persistent bound; a row's values move
    one class's sums per tree: the per-tree bound over all 200 trees."""
    spent = privacy_spent(_config("multiclass"), 400, per_round=4)
    assert spent["trees_sent"] == {"m0": 200, "m1": 200}
    sigma_l, sigma_t = spent["label_noise"], spent["tree_noise"]
    rho = 2 * 50 / (2 * (sigma_t ** 2 + 50 * sigma_l ** 2))
    assert spent["label_epsilon"]["m0"] == pytest.approx(_epsilon(rho))
    assert spent["label_epsilon"]["m0"] < _epsilon(1 / sigma_l ** 2)  # however many rounds
    assert spent["row_epsilon"]["m0"] == pytest.approx(_epsilon((2 * 200 + 0.5) / sigma_t ** 2))
    assert privacy_spent(_config("multiclass", members=3), 12, per_round=4)["trees_sent"] == \
        {"m0": 4, "m1": 4, "m2": 4}
