"""Seconds per tree of federated SecureBoost on default_credit, against the phe baseline.

    python -m benchmarks.train [--trees 5] [--bits 1024 2048]

For each key size: one embedded run (guest + host worker processes, ephemeral Prefect) on the
shipped default_credit config with ``--trees`` trees; prints PSI/set-up time, mean seconds per
tree, the time per protocol step, and the baseline measured in the same run: phe's time to encrypt one tree's g and h
separately for every row (a sample of encryptions, extrapolated).
"""

from __future__ import annotations

import argparse
import random
import re
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


# task run names of flows/secureboost.py without their "-t{tree}-d{depth}" coordinates
JOB_STEPS = ["open-job", "align-entities", "bin-features", "save-models", "close-job"]
TREE_STEPS = ["encrypt-gradients", "build-histograms", "find-splits", "apply-splits",
              "broadcast-nodes", "finish-tree"]


def step_seconds(flow_run_id: object, by_depth: bool = False,
                 by_tree: bool = False) -> dict[str, float]:
    """Total run time per task name of one flow run, read back from the Prefect API (per step,
    or with ``by_depth`` per step and tree depth: ``build-histograms-d0``; with ``by_tree``
    every task run on its own: ``encrypt-gradients-t1``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    totals: dict[str, float] = {}
    runs: list = []  # type: ignore[type-arg]
    with get_client(sync_client=True) as client:
        while True:  # the API pages at 200
            page = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                limit=200, offset=len(runs))
            runs += page
            if len(page) < 200:
                break
    for run in runs:
        name = run.name if by_tree else re.sub(
            r"-t\d+(?=(-d\d+)?$)" if by_depth else r"-t\d+(-d\d+)?$", "", run.name)
        totals[name] = totals.get(name, 0.0) + run.total_run_time.total_seconds()
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", type=int, default=5)
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    _prefect_env.configure()
    import logging

    from fedboost.embedded import party_specs, run_embedded
    from flows.secureboost import vertical_secureboost
    from tests.scenarios import config_with

    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    logging.getLogger("prefect.flow_runs").setLevel(logging.WARNING)
    rows = []
    breakdowns = {}
    for bits in args.bits:
        config = config_with("default_credit.yaml", crypto={"key_bits": bits},
                             params={"n_trees": args.trees})
        with tempfile.TemporaryDirectory() as out:
            state = run_embedded(config.job, party_specs(config, Path(out)),
                                 lambda: vertical_secureboost(config, return_state=True))
        result = state.result()
        breakdowns[bits] = step_seconds(state.state_details.flow_run_id)
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
    print("\nseconds by step (Prefect task run times; each step includes its messaging)")
    print(f"{'per tree':<28}" + "".join(f"{b:>10}" for b in args.bits))
    for step in TREE_STEPS:
        cells = [breakdowns[b].get(step, 0.0) / args.trees for b in args.bits]
        print(f"  {step:<26}" + "".join(f"{c:>10.3f}" for c in cells))
    print("per job (once)")
    for step in JOB_STEPS:
        cells = [breakdowns[b].get(step, 0.0) for b in args.bits]
        print(f"  {step:<26}" + "".join(f"{c:>10.3f}" for c in cells))


if __name__ == "__main__":
    main()
