"""The harness's generic attacks find what is there (so a check that finds nothing means
something): a mask drawn from a public seed is replayed, a lone row's cells are solved from
counts, and a planted label direction is found."""

from __future__ import annotations

import numpy as np

from tests.privacy.harness import (best_correlation, best_direction_auc, determined_by_counts,
                                   overlapping_differences, replay)


def test_a_mask_from_a_public_seed_is_replayed_and_one_from_a_secret_is_not() -> None:
    def draw(rng: np.random.Generator) -> np.ndarray:
        return rng.random(200) < 0.5

    public = draw(np.random.default_rng([17, 3, 1]))
    assert replay({5, 17, 40}, [range(5), range(3)], draw,
                  lambda d: np.array_equal(d, public)) == [(17, 3, 1)]
    secret = draw(np.random.default_rng([int.from_bytes(b"a member's own key", "big"), 3, 1]))
    assert replay({5, 17, 40}, [range(5), range(3)], draw,
                  lambda d: np.array_equal(d, secret)) == []


def test_counts_over_known_row_sets_determine_the_rows_they_isolate() -> None:
    # three rows, one cell each: the sums over {0,1,2} and {0,1} give row 2's cell
    truth = np.array([1.0, 0.0, 1.0])
    design = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    determined = determined_by_counts(design, design @ truth, prior=truth)
    assert determined.tolist() == [False, False, True]
    diffs = list(overlapping_differences({"all": (frozenset({0, 1, 2}), np.array([2.0])),
                                          "two": (frozenset({0, 1}), np.array([1.0]))}))
    assert [(a, b, set(rows), d.tolist()) for a, b, rows, d in diffs] == [
        ("all", "two", {2}, [1.0])]


def test_a_planted_label_direction_is_found_and_noise_is_not() -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(400) < 0.4
    noise = rng.normal(size=(400, 6))
    planted = noise.copy()
    planted[:, 0] += 3.0 * labels
    planted = planted @ rng.normal(size=(6, 6))  # an unknown linear map hides the column
    assert best_direction_auc(planted, labels) > 0.8
    assert best_direction_auc(noise, labels) < 0.62
    assert best_correlation(planted, labels.astype(float)) > 0.5
    assert best_correlation(noise, labels.astype(float)) < 0.2
