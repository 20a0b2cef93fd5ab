"""Statlog vehicle (846 rows, 18 features, 4 classes) split by rows among members, for the
row-partitioned protocols' multiclass configs (``configs/vehicle_homo.yaml``,
``configs/vehicle_simfl.yaml``).

    python -m benchmarks.vehicle_data --out runs/vehicle-homo-data [--parties 2] [--seed 0]

``../shared/data`` ships vehicle split by columns (``vehicle_scale_hetero_guest.csv``: id, y,
x0..x8; ``..._host.csv``: id, x0..x8). This joins the two on id (the host's columns become
x9..x17), splits the rows 75% / 25% stratified by class (``benchmarks.simfl_data``'s split),
deals the training rows out equally at random to the members (the paper's balanced partition)
and writes ``A.csv``, ``B.csv``, ... and ``test.csv`` (``id,y,x0..x17``; ids are the file's).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.simfl_data import split_and_write

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GUEST, HOST = "vehicle_scale_hetero_guest.csv", "vehicle_scale_hetero_host.csv"


def read_vehicle(folder: Path | str = DATA) -> tuple[np.ndarray, list[str], np.ndarray,
                                                    np.ndarray]:
    """The joined rows: ids (the guest's order), column names, features, labels 0..3."""
    folder = Path(folder)
    guest = np.genfromtxt(folder / GUEST, delimiter=",", skip_header=1)
    host = np.genfromtxt(folder / HOST, delimiter=",", skip_header=1)
    at = {int(i): k for k, i in enumerate(host[:, 0])}
    if sorted(at) != sorted(int(i) for i in guest[:, 0]):
        raise ValueError(f"{folder}: the guest's and the host's vehicle ids differ")
    x = np.hstack([guest[:, 2:], host[[at[int(i)] for i in guest[:, 0]], 1:]])
    names = [f"x{j}" for j in range(x.shape[1])]
    return guest[:, 0].astype(np.int64), names, x, guest[:, 1]


def prepare(out: Path | str, *, parties: int = 2, seed: int = 0,
            folder: Path | str = DATA) -> dict[str, Path]:
    """Join, split (``seed``), partition (balanced, ``seed``) and write the members' and the
    test file; ids are ``vehicle-<id in the shipped files>``."""
    ids, names, x, y = read_vehicle(folder)
    return split_and_write(out, names, x, y, np.array([f"vehicle-{i}" for i in ids]),
                           partition_mode="balanced", theta=0.0, parties=parties, seed=seed)


def main(argv: list[str] | None = None) -> None:
    """Command line: write the members' and the test file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    for name, file in prepare(args.out, parties=args.parties, seed=args.seed,
                              folder=args.data).items():
        with open(file, encoding="utf-8") as handle:
            rows = sum(1 for _ in handle) - 1
        print(f"{name}: {file} ({rows} rows)")


if __name__ == "__main__":
    main()
