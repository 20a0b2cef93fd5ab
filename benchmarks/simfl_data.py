"""UCI Adult encoded as LIBSVM's a9a, split 75/25 and partitioned among SimFL members as in the
paper (Li, Wen, He, "Practical Federated Gradient Boosting Decision Trees", Section 6).

    python -m benchmarks.simfl_data --out runs/adult-simfl-data \
        [--partition unbalanced|balanced] [--theta 0.8] [--parties 2] [--seed 0]

writes ``A.csv``, ``B.csv``, ... (one per member) and ``test.csv``, columns ``id,y,<features>``,
the files ``configs/adult_simfl.yaml`` points at.

**Encoding** (:func:`encode_adult`). a9a (Platt 1999, as shipped by LIBSVM) has 123 binary
features: each categorical column with m categories becomes m one-hots, each of the six
continuous columns is cut into quintiles, one one-hot per quintile bin, and quintiles that
coincide (ties) collapse, which is why capital-gain and capital-loss get 2 bins. Ours:

- categoricals, with the categories of UCI's ``adult.names`` (every training value is one of
  them): workclass 8, education 16, marital-status 7, occupation 14, relationship 6, race 5,
  gender 2, native-country 41 = 99 one-hots, as in a9a. A missing value ('?', in workclass,
  occupation and native-country) sets none of its group's one-hots, as in a9a.
- continuous: the 20/40/60/80% quantiles of the whole file (label-free, like a9a's fixed
  encoding), duplicates dropped, bins right-closed (``v <= edge``): age 5 (edges 26, 33, 41,
  50), education-num 4 (quantiles 9, 9, 10, 13), capital-gain 2 (0 / >0: all four quantiles
  are 0), capital-loss 2 (likewise), hours-per-week 4 (quantiles 35, 40, 40, 48) = 17
  one-hots. (``pandas.qcut(q=5, duplicates='drop')`` would differ only for capital-gain and
  capital-loss, merging 0 and >0 into one bin.)
- fnlwgt (5 one-hots in a9a) is not in ``adult.csv.gz``.

That gives **116** features; a9a's 123 are these plus fnlwgt's 5 and one more bin each for
education-num and hours-per-week, whose tie handling a9a does not document.

**Split** (:func:`split_train_test`): stratified by label, 75% train / 25% test.

**Partition** (:func:`partition`), the paper's words: unbalanced - "randomly sample theta
proportion of the instances with class 0 and (1 - theta) of the instances with class 1 to form
a subset, and the remained for the other subset. Then ... split these two subsets to more parts
equally and randomly to simulate more parties"; balanced - "split the datasets equally and
randomly".
"""

from __future__ import annotations

import argparse
import csv
import gzip
from pathlib import Path

import numpy as np

ADULT = Path(__file__).resolve().parents[2] / "shared" / "data" / "adult.csv.gz"
TRAIN_FRACTION = 0.75  # the paper: "75% of the datasets for training and the remainder for testing"
QUANTILES = (0.2, 0.4, 0.6, 0.8)  # quintiles, as Platt's a9a
MISSING = "?"
LABEL_COLUMN, POSITIVE = "income", ">50K"

CONTINUOUS = ("age", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORIES: dict[str, tuple[str, ...]] = {  # UCI adult.names, in its order
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm",
                  "Assoc-voc", "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th",
                  "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
                   "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative",
                     "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "gender": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China",
                       "Cuba", "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica",
                       "Vietnam", "Mexico", "Portugal", "Ireland", "France",
                       "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                       "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia",
                       "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
FILE_ORDER = ("age", "workclass", "education", "education-num", "marital-status", "occupation",
              "relationship", "race", "gender", "capital-gain", "capital-loss", "hours-per-week",
              "native-country")  # a9a's order of the original columns, fnlwgt left out


def read_adult(path: Path | str = ADULT) -> tuple[np.ndarray, dict[str, list[str]]]:
    """The file's row ids and its columns as stripped strings (its first, unnamed column is
    the row id)."""
    with gzip.open(path, "rt", newline="") as handle:
        rows = list(csv.reader(handle))
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r]
    columns = {name: [r[j].strip() for r in body] for j, name in enumerate(header)}
    absent = [c for c in (*FILE_ORDER, LABEL_COLUMN) if c not in columns]
    if absent:
        raise ValueError(f"{path}: no column(s) {', '.join(absent)}")
    return np.array([int(v) for v in columns[header[0]]]), columns


def quintile_edges(values: np.ndarray) -> np.ndarray:
    """The distinct inner quintiles of ``values``: bin k holds edges[k-1] < v <= edges[k]."""
    inner = np.unique(np.quantile(values, QUANTILES))
    return inner[inner < values.max()]  # an edge at the maximum would leave its top bin empty


def _bin_names(column: str, edges: np.ndarray) -> list[str]:
    bounds = [f"{e:g}" for e in edges]
    if not bounds:
        return [f"{column}=all"]
    names = [f"{column}<={bounds[0]}"]
    names += [f"{column}=({lo}..{hi}]" for lo, hi in zip(bounds, bounds[1:])]
    return names + [f"{column}>{bounds[-1]}"]


def encode_adult(path: Path | str = ADULT) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Encode Adult as a9a does (module docstring): binary features and 0/1 labels.

    Returns
    -------
    names, x, y
        The 116 feature names, ``x`` (n, 116) float64 of 0/1, ``y`` (n,) with 1 for '>50K'.

    Raises
    ------
    ValueError
        A column is absent, or a categorical value is not among ``adult.names``' categories.
    """
    _, columns = read_adult(path)
    n = len(columns[LABEL_COLUMN])
    names: list[str] = []
    blocks: list[np.ndarray] = []
    for column in FILE_ORDER:
        cells = columns[column]
        if column in CONTINUOUS:
            values = np.array(cells, dtype=np.float64)
            edges = quintile_edges(values)
            which = np.searchsorted(edges, values, side="left")  # right-closed bins
            block = np.zeros((n, edges.size + 1))
            block[np.arange(n), which] = 1.0
            names += _bin_names(column, edges)
        else:
            categories = CATEGORIES[column]
            unknown = sorted({c for c in cells if c != MISSING} - set(categories))
            if unknown:
                raise ValueError(f"{path}: column {column!r}: unknown categories "
                                 f"{', '.join(unknown)}")
            index = {c: k for k, c in enumerate(categories)}
            block = np.zeros((n, len(categories)))
            present = [(i, index[c]) for i, c in enumerate(cells) if c != MISSING]
            rows, cols = zip(*present) if present else ((), ())
            block[list(rows), list(cols)] = 1.0
            names += [f"{column}={c}" for c in categories]
        blocks.append(block)
    labels = columns[LABEL_COLUMN]
    bad = sorted(set(labels) - {POSITIVE, "<=50K"})
    if bad:
        raise ValueError(f"{path}: column {LABEL_COLUMN!r}: unknown labels {', '.join(bad)}")
    y = np.array([1.0 if v == POSITIVE else 0.0 for v in labels])
    return names, np.hstack(blocks), y


def split_train_test(x: np.ndarray, y: np.ndarray, seed: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stratified 75% / 25% split: ``x_train, y_train, x_test, y_test``.

    Each class contributes round(75%) of its rows to training, chosen at random with ``seed``;
    rows keep their file order within each side (use :func:`split_indices` for the indices).
    """
    train, test = split_indices(y, seed)
    return x[train], y[train], x[test], y[test]


def split_indices(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the stratified 75% / 25% split (sorted)."""
    rng = np.random.default_rng(seed)
    train = []
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label))
        train.append(rows[: int(round(TRAIN_FRACTION * rows.size))])
    chosen = np.sort(np.concatenate(train))
    return chosen, np.setdiff1d(np.arange(y.size), chosen)


def partition(y_train: np.ndarray, parties: int, mode: str, theta: float = 0.8,
              seed: int = 0) -> list[np.ndarray]:
    """Row indices (sorted) of each party's share of the training rows, as in the paper.

    ``unbalanced``: subset A is round(theta * n0) random class-0 rows and
    round((1 - theta) * n1) random class-1 rows, subset B the rest; with ``parties`` > 2
    (even) each subset is split equally at random into ``parties / 2`` parts (A's parts first).
    ``balanced``: the rows split equally at random into ``parties`` parts.
    """
    if parties < 2:
        raise ValueError(f"partition: {parties} parties; at least 2")
    rng = np.random.default_rng(seed)
    if mode == "balanced":
        return [np.sort(p) for p in np.array_split(rng.permutation(y_train.size), parties)]
    if mode != "unbalanced":
        raise ValueError(f"partition: mode {mode!r}; 'unbalanced' or 'balanced'")
    if not 0.0 < theta < 1.0:
        raise ValueError(f"partition: theta {theta}; it must lie in (0, 1)")
    if parties % 2:
        raise ValueError(f"partition: unbalanced needs an even number of parties, not {parties}")
    zeros = rng.permutation(np.flatnonzero(y_train == 0))
    ones = rng.permutation(np.flatnonzero(y_train == 1))
    k0, k1 = int(round(theta * zeros.size)), int(round((1.0 - theta) * ones.size))
    subset_a = np.concatenate([zeros[:k0], ones[:k1]])
    subset_b = np.concatenate([zeros[k0:], ones[k1:]])
    per_subset = parties // 2
    parts = [*np.array_split(rng.permutation(subset_a), per_subset),
             *np.array_split(rng.permutation(subset_b), per_subset)]
    return [np.sort(p) for p in parts]


def member_names(parties: int) -> list[str]:
    """Members are named A, B, C, ... (the paper's parties A and B)."""
    if not 1 <= parties <= 26:
        raise ValueError(f"{parties} members; 1 to 26 are named")
    return [chr(ord("A") + k) for k in range(parties)]


def write_member_files(folder: Path | str, names: list[str], x: np.ndarray, y: np.ndarray,
                       parts: list[np.ndarray], test: tuple[np.ndarray, np.ndarray],
                       ids: np.ndarray | None = None,
                       test_ids: np.ndarray | None = None) -> dict[str, Path]:
    """Write each member's rows (``x[part]``) and the test rows as ``id,y,<features>`` CSVs.

    ``x``, ``y`` are the training rows, ``test`` is ``(x_test, y_test)``. Ids (default: the
    row's position, ``train-<k>`` / ``test-<k>``) are unique across all files. Returns
    ``{"A": .../A.csv, ..., "test": .../test.csv}``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if ids is None:
        ids = np.array([f"train-{k}" for k in range(y.size)])
    if test_ids is None:
        test_ids = np.array([f"test-{k}" for k in range(test[1].size)])
    files: dict[str, Path] = {}
    for member, part in zip(member_names(len(parts)), parts):
        files[member] = _write_csv(folder / f"{member}.csv", names, ids[part], x[part], y[part])
    files["test"] = _write_csv(folder / "test.csv", names, test_ids, test[0], test[1])
    return files


def _write_csv(path: Path, names: list[str], ids: np.ndarray, x: np.ndarray,
               y: np.ndarray) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(["id", "y", *names])
        for ident, label, row in zip(ids, y, x):
            out.writerow([ident, f"{label:g}", *(f"{v:g}" for v in row)])
    return path


def prepare(out: Path | str, *, partition_mode: str = "unbalanced", theta: float = 0.8,
            parties: int = 2, seed: int = 0, path: Path | str = ADULT) -> dict[str, Path]:
    """Encode, split (``seed``), partition (``seed``) and write the members' and test files;
    ids are ``adult-<row id in the file>``."""
    row_ids, _ = read_adult(path)
    names, x, y = encode_adult(path)
    ids = np.array([f"adult-{r}" for r in row_ids])
    return split_and_write(out, names, x, y, ids, partition_mode=partition_mode, theta=theta,
                           parties=parties, seed=seed)


def split_and_write(out: Path | str, names: list[str], x: np.ndarray, y: np.ndarray,
                    ids: np.ndarray, *, partition_mode: str, theta: float, parties: int,
                    seed: int) -> dict[str, Path]:
    """Split the rows 75/25 (``seed``), partition the training rows among the members
    (``seed``) and write the members' and the test file."""
    train, test = split_indices(y, seed)
    parts = partition(y[train], parties, partition_mode, theta, seed)
    return write_member_files(out, names, x[train], y[train], parts, (x[test], y[test]),
                              ids=ids[train], test_ids=ids[test])


def main(argv: list[str] | None = None) -> None:
    """Command line: write the members' and the test file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--partition", choices=("unbalanced", "balanced"), default="unbalanced")
    parser.add_argument("--theta", type=float, default=0.8)
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=ADULT)
    args = parser.parse_args(argv)
    files = prepare(args.out, partition_mode=args.partition, theta=args.theta,
                    parties=args.parties, seed=args.seed, path=args.data)
    for name, file in files.items():
        with open(file, encoding="utf-8") as handle:
            rows = sum(1 for _ in handle) - 1
        print(f"{name}: {file} ({rows} rows)")


if __name__ == "__main__":
    main()
