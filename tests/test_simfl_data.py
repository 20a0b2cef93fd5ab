"""The SimFL benchmark's data: Adult encoded as a9a, the 75/25 split, the paper's partitions and
member files that the workers read."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.simfl_data import (CATEGORIES, encode_adult, partition, prepare, read_adult,
                                   split_indices, split_train_test, write_member_files)
from workers.data import load_party_data

N_ROWS = 32_561  # UCI Adult's training file, a9a's 32,561
N_FEATURES = 116  # a9a's 123 less fnlwgt's 5 and one bin each of education-num, hours-per-week


@pytest.fixture(scope="module")
def adult() -> tuple[list[str], np.ndarray, np.ndarray]:
    return encode_adult()


def test_encoding_is_binary_with_one_hot_per_present_value(adult) -> None:
    names, x, y = adult
    _, columns = read_adult()

    assert x.shape == (N_ROWS, N_FEATURES) and x.dtype == np.float64
    assert len(names) == N_FEATURES == len(set(names))
    assert set(np.unique(x)) == {0.0, 1.0}
    assert set(np.unique(y)) == {0.0, 1.0}
    assert int(y.sum()) == sum(v == ">50K" for v in columns["income"])
    # every group has exactly one 1, except a categorical's '?' rows, which have none
    for group in ("age", "education-num", "capital-gain", "capital-loss", "hours-per-week",
                  *CATEGORIES):
        at = [j for j, n in enumerate(names) if re.split("[=<>]", n)[0] == group]
        ones = x[:, at].sum(axis=1)
        missing = np.array([v == "?" for v in columns[group]])
        assert np.all(ones[~missing] == 1) and np.all(ones[missing] == 0), group
    assert [len([n for n in names if n.startswith(c + "=")]) for c in CATEGORIES] == \
        [8, 16, 7, 14, 6, 5, 2, 41]


def test_continuous_bins_follow_the_quintiles(adult) -> None:
    names, x, _ = adult
    _, columns = read_adult()
    age = np.array(columns["age"], dtype=float)

    assert [n for n in names if n.startswith("capital-gain")] == ["capital-gain<=0",
                                                                   "capital-gain>0"]
    assert np.array_equal(x[:, names.index("capital-gain>0")],
                          (np.array(columns["capital-gain"], dtype=float) > 0).astype(float))
    young = x[:, names.index("age<=26")] == 1
    assert np.array_equal(young, age <= 26)
    assert 0.15 < young.mean() < 0.25  # a quintile, give or take the ties at 26


def test_split_is_stratified_75_25(adult) -> None:
    _, x, y = adult

    train, test = split_indices(y, seed=0)
    x_train, y_train, x_test, y_test = split_train_test(x, y, seed=0)

    assert np.intersect1d(train, test).size == 0 and train.size + test.size == y.size
    assert abs(train.size - 0.75 * y.size) <= 2
    assert abs(y_train.mean() - y.mean()) < 1e-3 and abs(y_test.mean() - y.mean()) < 1e-3
    assert np.array_equal(x_train, x[train]) and np.array_equal(y_test, y[test])
    assert not np.array_equal(split_indices(y, seed=1)[0], train)


def _check_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.size == n and np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("theta", [0.6, 0.8, 0.9])
def test_unbalanced_partition_takes_theta_of_class_0_and_the_rest_of_class_1(adult,
                                                                             theta) -> None:
    _, _, y = adult
    y_train = y[split_indices(y, 0)[0]]
    zeros, ones = int((y_train == 0).sum()), int((y_train == 1).sum())

    a, b = partition(y_train, 2, "unbalanced", theta, seed=0)

    _check_disjoint_cover([a, b], y_train.size)
    assert abs((y_train[a] == 0).sum() - theta * zeros) <= 1
    assert abs((y_train[a] == 1).sum() - (1 - theta) * ones) <= 1
    assert abs((y_train[b] == 0).sum() - (1 - theta) * zeros) <= 1
    assert abs((y_train[b] == 1).sum() - theta * ones) <= 1


def test_unbalanced_partition_splits_each_subset_equally_for_more_parties(adult) -> None:
    _, _, y = adult
    y_train = y[split_indices(y, 0)[0]]
    two = partition(y_train, 2, "unbalanced", 0.8, seed=3)

    four = partition(y_train, 4, "unbalanced", 0.8, seed=3)

    _check_disjoint_cover(four, y_train.size)
    assert np.array_equal(np.sort(np.concatenate(four[:2])), two[0])
    assert abs(four[0].size - four[1].size) <= 1 and abs(four[2].size - four[3].size) <= 1
    with pytest.raises(ValueError, match="even number"):
        partition(y_train, 3, "unbalanced", 0.8, seed=0)


@pytest.mark.parametrize("parties", [2, 5])
def test_balanced_partition_is_an_equal_random_split(adult, parties) -> None:
    _, _, y = adult
    y_train = y[split_indices(y, 0)[0]]

    parts = partition(y_train, parties, "balanced", 0.8, seed=0)

    _check_disjoint_cover(parts, y_train.size)
    assert max(p.size for p in parts) - min(p.size for p in parts) <= 1
    for p in parts:  # random, so each share has about the overall positive rate
        assert abs(y_train[p].mean() - y_train.mean()) < 0.03


def test_partition_rejects_bad_arguments() -> None:
    y = np.array([0, 1, 0, 1], dtype=float)
    for args in [(1, "balanced", 0.8), (2, "skewed", 0.8), (2, "unbalanced", 1.0)]:
        with pytest.raises(ValueError, match="partition"):
            partition(y, *args)


def test_member_files_load_as_party_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    names = ["a=1", "b<=2", "c=(2..5]"]
    x = rng.integers(0, 2, size=(10, 3)).astype(float)
    y = np.array([0, 1] * 5, dtype=float)
    x_test, y_test = x[:4], y[:4]

    files = write_member_files(tmp_path, names, x, y, [np.arange(6), np.arange(6, 10)],
                               (x_test, y_test))

    assert sorted(files) == ["A", "B", "test"]
    a = load_party_data("A", files["A"], "id", "y", require_label=True)
    b = load_party_data("B", files["B"], "id", "y", require_label=True)
    test = load_party_data("test", files["test"], "id", "y", require_label=True)
    assert a.names == tuple(names) == test.names
    assert np.array_equal(a.x, x[:6]) and np.array_equal(b.y, y[6:])
    assert np.array_equal(test.x, x_test)
    assert len(set(a.ids) | set(b.ids) | set(test.ids)) == 14


def test_prepare_writes_the_papers_unbalanced_members(tmp_path: Path) -> None:
    files = prepare(tmp_path, partition_mode="unbalanced", theta=0.8, parties=2, seed=0)

    loaded = {m: load_party_data(m, files[m], "id", "y", require_label=True)
              for m in ("A", "B", "test")}

    assert sum(len(d.ids) for d in loaded.values()) == N_ROWS
    assert len(set().union(*(d.ids for d in loaded.values()))) == N_ROWS
    assert all(d.x.shape[1] == N_FEATURES for d in loaded.values())
    assert loaded["A"].y.mean() < 0.1 < 0.5 < loaded["B"].y.mean()
    assert abs(len(loaded["test"].ids) - 0.25 * N_ROWS) <= 2
