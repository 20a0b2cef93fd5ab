"""Adult (as LIBSVM's a9a, see ``benchmarks.simfl_data``) split by columns over three parties,
for the vertical random forest: the lender (``guest``) holds the label and the first third of
the 116 binary features, two data providers (``bureau``, ``telco``) a third each.

    python -m benchmarks.forest_data --out runs/adult-vertical

writes ``guest.csv`` (``id,y,...``), ``bureau.csv`` and ``telco.csv`` (``id,...``) and
``adult_forest.yaml``, a job over them (validation: a quarter of the rows held out).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import yaml

from benchmarks.simfl_data import ADULT, encode_adult

PARTIES = ("guest", "bureau", "telco")


def write_vertical_adult(folder: Path | str, path: Path | str = ADULT) -> dict[str, Path]:
    """Write the three parties' files; returns party -> CSV path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names, x, y = encode_adult(path)
    ids = [f"a{k:05d}" for k in range(y.size)]
    groups = np.array_split(np.arange(len(names)), len(PARTIES))
    files = {}
    for party, columns in zip(PARTIES, groups):
        out = folder / f"{party}.csv"
        with out.open("w", newline="") as handle:
            writer = csv.writer(handle)
            label = ["y"] if party == "guest" else []
            writer.writerow(["id", *label, *[names[c] for c in columns]])
            for k, ident in enumerate(ids):
                cells = [int(y[k])] if party == "guest" else []
                writer.writerow([ident, *cells, *x[k, columns].astype(int).tolist()])
        files[party] = out
    return files


def forest_job(files: dict[str, Path], job: str = "adult-forest", **params: object) -> dict:
    """A vertical_random_forest job over the files (seed 002's a9a setting by default)."""
    parties = {p: {"role": "active" if p == "guest" else "passive", "data": str(f), "id": "id"}
               for p, f in files.items()}
    parties["guest"]["label"] = "y"
    return {"job": job, "protocol": "vertical_random_forest", "parties": parties,
            "params": {"n_trees": 50, "max_depth": 10, "max_features": "sqrt",
                       "min_samples_leaf": 5, **params},
            "crypto": {"key_bits": 2048}, "validation": {"fraction": 0.25, "seed": 0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/adult-vertical"))
    parser.add_argument("--adult", type=Path, default=ADULT)
    args = parser.parse_args()
    files = write_vertical_adult(args.out, args.adult)
    job = args.out / "adult_forest.yaml"
    job.write_text(yaml.safe_dump(forest_job({p: f.resolve() for p, f in files.items()})))
    print(f"wrote {', '.join(str(f) for f in files.values())} and {job}")


if __name__ == "__main__":
    main()
