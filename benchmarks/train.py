"""Seconds per tree of federated SecureBoost on default_credit, against the phe baseline.

    python -m benchmarks.train [--trees 5] [--bits 1024 2048]

For each key size: one embedded run (guest + host worker processes, ephemeral Prefect) on the
shipped default_credit config with ``--trees`` trees; prints PSI/set-up time, mean seconds per
tree, and the baseline measured in the same run: phe's time to encrypt one tree's g and h
separately for every row (a sample of encryptions, extrapolated).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from fedboost import _prefect_env


def phe_tree_baseline(bits: int, rows: int, sample: int = 200) -> float:
    """Seconds phe needs to encrypt g and h (two numbers) for ``rows`` rows."""
    import phe

    public, _ = phe.generate_paillier_keypair(n_length=bits)
    values = [random.uniform(-1, 1) for _ in range(sample)]
    start = time.perf_counter()
    for v in values:
        public.encrypt(v)
    return (time.perf_counter() - start) / sample * 2 * rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", type=int, default=5)
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    _prefect_env.configure()
    import logging

    from fedboost.embedded import train_embedded
    from tests.scenarios import config_with

    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    logging.getLogger("prefect.flow_runs").setLevel(logging.WARNING)
    rows = []
    for bits in args.bits:
        config = config_with("default_credit.yaml", crypto={"key_bits": bits},
                             params={"n_trees": args.trees})
        with tempfile.TemporaryDirectory() as out:
            result = train_embedded(config, Path(out))
        per_tree = result["tree_seconds"]
        mean = sum(per_tree) / len(per_tree)
        setup = result["train_seconds"] - sum(per_tree)
        baseline = phe_tree_baseline(bits, result["n_train"])
        rows.append((bits, result["n_train"], setup, mean, min(per_tree), baseline))
    print(f"\ndefault_credit, 2 parties, depth 3, 32 bins, {args.trees} trees per run")
    print(f"{'key bits':>8} {'rows':>6} {'set-up s':>9} {'s/tree':>7} {'best':>6} "
          f"{'phe baseline s/tree':>20} {'baseline/ours':>14}")
    for bits, n, setup, mean, best, baseline in rows:
        print(f"{bits:>8} {n:>6} {setup:>9.1f} {mean:>7.2f} {best:>6.2f} {baseline:>20.0f} "
              f"{baseline / mean:>14.0f}x")


if __name__ == "__main__":
    main()
