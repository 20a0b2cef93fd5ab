"""Seconds per tree of federated SecureBoost, against the phe baseline.

    python -m benchmarks.train [--workload default_credit|fedtree] [--trees 5] [--bits 1024 2048]
                               [--scheme paillier ou] [--json FILE]

Workloads:
- ``default_credit`` (the default): the shipped config (30,000 rows, 13 + 10 columns, depth 3,
  32 bins), as ``make train`` runs it.
- ``fedtree``: FedTree's benchmark shape: 10,000 x 30 synthetic rows
  (``make_classification``, seed 0), 15 columns at the lender and 15 at the data provider,
  depth 6, 32 bins, learning rate 0.1; 2048-bit keys unless ``--bits`` says otherwise.

For each key size: one embedded run (guest + host worker processes, ephemeral Prefect) with
``--trees`` trees; prints PSI/set-up time, mean seconds per tree, the time per protocol step
(and per tree depth), and the baseline measured in the same run: phe's time to encrypt one
tree's g and h separately for every row (a sample of encryptions, extrapolated). ``--json``
writes the numbers (``tree_seconds`` per key size, ``steps``, ``steps_by_depth``).

``--scheme paillier ou`` runs each key size under both encryption schemes in the same run
(``crypto.scheme``) and prints OU against Paillier: seconds per tree and bytes between the
parties per tree (every message between two parties, counted on the embedded hub; the flow's
commands are not counted). With ``--rounds R`` the schemes run R times, alternating their
order (A B, B A, A B, ...) so that a machine whose speed drifts during the run weighs on both
alike; the printout adds each round's ratio and their median, and the JSON's ``by_scheme`` holds
each scheme's median seconds per tree (``tree_seconds``) and every round's
(``tree_seconds_by_round``). The step tables are the first round's.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedboost import _prefect_env

if TYPE_CHECKING:
    from flows.config import SecureBoostJobConfig


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


def task_runs(flow_run_id: object) -> list[Any]:
    """Every task run of one flow run, read back from the Prefect API (which pages at 200)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs: list[Any] = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                limit=200, offset=len(runs))
            runs += page
            if len(page) < 200:
                return runs


def step_seconds(flow_run_id: object, by_depth: bool = False,
                 by_tree: bool = False) -> dict[str, float]:
    """Total run time per task name of one flow run, read back from the Prefect API (per step,
    or with ``by_depth`` per step and tree depth: ``build-histograms-d0``; with ``by_tree``
    every task run on its own: ``encrypt-gradients-t1``)."""
    totals: dict[str, float] = {}
    for run in task_runs(flow_run_id):
        name = run.name if by_tree else re.sub(
            r"-t\d+(?=(-d\d+)?$)" if by_depth else r"-t\d+(-d\d+)?$", "", run.name)
        totals[name] = totals.get(name, 0.0) + run.total_run_time.total_seconds()
    return totals


FEDTREE_ROWS, FEDTREE_FEATURES = 10_000, 30


def write_fedtree_data(folder: Path) -> dict[str, Path]:
    """FedTree's synthetic benchmark shape, seed 0: the lender's file (``id,y`` and 15 columns)
    and the data provider's (``id`` and the other 15)."""
    import numpy as np
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=FEDTREE_ROWS, n_features=FEDTREE_FEATURES,
                               n_informative=10, n_redundant=10, random_state=0)
    ids = np.array([f"r{k:06d}" for k in range(FEDTREE_ROWS)])
    half = FEDTREE_FEATURES // 2
    files = {"guest": folder / "guest.csv", "host": folder / "host.csv"}
    header = ",".join(f"x{k}" for k in range(FEDTREE_FEATURES))
    with files["guest"].open("w") as out:
        out.write("id,y," + ",".join(header.split(",")[:half]) + "\n")
        for ident, label, row in zip(ids, y, x[:, :half]):
            out.write(f"{ident},{label}," + ",".join(f"{v:.6g}" for v in row) + "\n")
    with files["host"].open("w") as out:
        out.write("id," + ",".join(header.split(",")[half:]) + "\n")
        for ident, row in zip(ids, x[:, half:]):
            out.write(f"{ident}," + ",".join(f"{v:.6g}" for v in row) + "\n")
    return files


def workload_config(workload: str, folder: Path, bits: int, trees: int,
                    pack_bin_sums: str = "key_holder",
                    scheme: str = "paillier") -> SecureBoostJobConfig:
    """The job a workload runs, with ``bits``-bit keys of ``scheme`` and ``trees`` trees."""
    from benchmarks.job_files import config_with
    from flows.config import SecureBoostJobConfig, parse_config

    crypto = {"key_bits": bits, "pack_bin_sums": pack_bin_sums, "scheme": scheme}
    if workload == "default_credit":
        config = config_with("default_credit.yaml", crypto=crypto, params={"n_trees": trees})
    else:
        config = parse_config(_fedtree_job(folder, trees, crypto), base=folder,
                              source=f"{workload} workload")
    if not isinstance(config, SecureBoostJobConfig):
        raise SystemExit(f"{workload}: a workload is a vertical SecureBoost job, not "
                         f"{config.protocol}")
    return config


def _fedtree_job(folder: Path, trees: int, crypto: dict[str, Any]) -> dict[str, Any]:
    """FedTree's benchmark shape on our data (``write_fedtree_data``), as a job file."""
    files = write_fedtree_data(folder)
    raw = {"job": "fedtree-shape", "protocol": "vertical_secureboost",
           "parties": {"guest": {"role": "active", "data": str(files["guest"]), "id": "id",
                                 "label": "y"},
                       "host": {"role": "passive", "data": str(files["host"]), "id": "id"}},
           "params": {"n_trees": trees, "max_depth": 6, "learning_rate": 0.1, "max_bin": 32,
                      "objective": "binary", "reg_lambda": 1.0, "seed": 0},
           "crypto": crypto, "validation": {"fraction": 0.0, "seed": 0},
           "transport": {"kind": "memory"}}
    return raw


SHAPES = {"default_credit": "default_credit, 2 parties, depth 3, 32 bins",
          "fedtree": "FedTree's shape (10,000 x 30 synthetic, 15 + 15 columns), depth 6, 32 bins"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--workload", choices=sorted(SHAPES), default="default_credit")
    parser.add_argument("--trees", type=int, default=5)
    parser.add_argument("--bits", type=int, nargs="+", default=None,
                        help="key sizes (default: 1024 2048; fedtree: 2048)")
    parser.add_argument("--pack-bin-sums", choices=["key_holder", "passive"], default="key_holder",
                        help="who folds bin sums into shared ciphertexts (crypto.pack_bin_sums)")
    parser.add_argument("--scheme", nargs="+", choices=["paillier", "ou"], default=["paillier"],
                        help="encryption schemes (crypto.scheme), each in the same run")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the schemes this many times, alternating their order")
    parser.add_argument("--json", type=Path, help="write the numbers to this file")
    args = parser.parse_args()
    if args.rounds < 1 or (args.rounds > 1 and len(args.scheme) < 2):
        parser.error("--rounds takes a number >= 1, and more than one round needs two schemes")
    bits_list = args.bits or ([2048] if args.workload == "fedtree" else [1024, 2048])
    _prefect_env.configure()
    import logging

    from fedboost.embedded import FLOW_ENDPOINT, party_specs, run_embedded
    from flows.secureboost import vertical_secureboost
    from messages.transport import MemoryHub

    logging.getLogger("prefect").setLevel(logging.WARNING)
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    logging.getLogger("prefect.flow_runs").setLevel(logging.WARNING)
    rows = []
    breakdowns, by_depth, tree_seconds = {}, {}, {}
    by_scheme: dict[str, dict[str, Any]] = {}
    by_round: dict[str, list[tuple[float, float]]] = {}  # (s/tree, bytes/tree) per round
    runs = [(bits, scheme, r) for r in range(args.rounds) for bits in bits_list
            for scheme in (args.scheme if r % 2 == 0 else args.scheme[::-1])]
    for bits, scheme, round_ in runs:
        counted = len(args.scheme) > 1
        with tempfile.TemporaryDirectory() as out:
            config = workload_config(args.workload, Path(out), bits, args.trees,
                                     args.pack_bin_sums, scheme)
            specs = party_specs(config, Path(out) / "models")
            hub = MemoryHub([s.name for s in specs] + [FLOW_ENDPOINT], record=counted)
            try:
                state = run_embedded(config.job, specs,
                                     lambda: vertical_secureboost(config, return_state=True),
                                     hub=hub)
                wire = sum(len(data) for sender, to, data in (hub.recorded() if counted else [])
                           if FLOW_ENDPOINT not in (sender, to) and sender != to)
            finally:
                hub.close()
        result = state.result()
        if counted:
            by_round.setdefault(f"{bits}-{scheme}", []).append(
                (sum(result["tree_seconds"]) / len(result["tree_seconds"]), wire / args.trees))
        if round_:
            continue  # the step tables and the phe baseline are the first round's
        column = f"{bits} {scheme}" if counted else bits
        breakdowns[column] = step_seconds(state.state_details.flow_run_id)
        by_depth[column] = step_seconds(state.state_details.flow_run_id, by_depth=True)
        if scheme != args.scheme[0]:
            continue  # the first table and the JSON's top level are of the first scheme
        per_tree = result["tree_seconds"]
        tree_seconds[bits] = per_tree
        mean = sum(per_tree) / len(per_tree)
        setup = result["train_seconds"] - sum(per_tree)
        baseline = phe_tree_baseline(bits, result["n_train"])
        rows.append((bits, result["n_train"], setup, mean, min(per_tree), baseline))
    print(f"\n{SHAPES[args.workload]}, {args.trees} trees per run")
    print(f"{'key bits':>8} {'rows':>6} {'set-up s':>9} {'s/tree':>7} {'best':>6} "
          f"{'phe baseline s/tree':>20} {'baseline/ours':>14}")
    for bits, n, setup, mean, best, baseline in rows:
        print(f"{bits:>8} {n:>6} {setup:>9.1f} {mean:>7.2f} {best:>6.2f} {baseline:>20.0f} "
              f"{baseline / mean:>14.0f}x")
    columns = list(breakdowns)
    print("\nseconds by step (Prefect task run times; each step includes its messaging)")
    print(f"{'per tree':<28}" + "".join(f"{b:>16}" for b in columns))
    for step in TREE_STEPS:
        cells = [breakdowns[b].get(step, 0.0) / args.trees for b in columns]
        print(f"  {step:<26}" + "".join(f"{c:>16.3f}" for c in cells))
    print("per tree and depth")
    depth_steps = sorted({k for b in columns for k in by_depth[b] if re.search(r"-d\d+$", k)},
                         key=lambda k: (int(k.rsplit("-d", 1)[1]), k))
    for step in depth_steps:
        cells = [by_depth[b].get(step, 0.0) / args.trees for b in columns]
        print(f"  {step:<26}" + "".join(f"{c:>16.3f}" for c in cells))
    print("per job (once)")
    for step in JOB_STEPS:
        cells = [breakdowns[b].get(step, 0.0) for b in columns]
        print(f"  {step:<26}" + "".join(f"{c:>16.3f}" for c in cells))
    for key, rounds in by_round.items():
        by_scheme[key] = {
            "tree_seconds": statistics.median(seconds for seconds, _ in rounds),
            "wire_bytes_per_tree": statistics.median(wire for _, wire in rounds),
            "tree_seconds_by_round": [seconds for seconds, _ in rounds]}
    if by_scheme:
        print(f"\nencryption schemes, same run ({', '.join(args.scheme)}): per tree"
              + (f", median of {args.rounds} rounds" if args.rounds > 1 else ""))
        print(f"{'run':<16}{'s/tree':>9}{'MB on the wire':>16}{'s ratio':>9}{'bytes ratio':>12}")
        for bits in bits_list:
            base = by_scheme[f"{bits}-{args.scheme[0]}"]
            for scheme in args.scheme:
                r = by_scheme[f"{bits}-{scheme}"]
                print(f"{f'{bits} {scheme}':<16}{r['tree_seconds']:>9.2f}"
                      f"{r['wire_bytes_per_tree'] / 1e6:>16.2f}"
                      f"{base['tree_seconds'] / r['tree_seconds']:>8.2f}x"
                      f"{r['wire_bytes_per_tree'] / base['wire_bytes_per_tree']:>11.2f}x")
        print("s ratio: the first scheme's seconds per tree over this one's (> 1: faster); "
              "bytes ratio: this one's bytes over the first's")
        if args.rounds > 1:
            print_rounds(by_round, bits_list, args.scheme)
    if args.json:
        only = bits_list[-1]  # the contract's top-level keys: the largest key size's run
        first = f"{only} {args.scheme[0]}" if len(args.scheme) > 1 else only
        args.json.write_text(json.dumps({
            "workload": args.workload, "key_bits": only, "tree_seconds": tree_seconds[only],
            "steps": {k: v / args.trees for k, v in breakdowns[first].items() if k in TREE_STEPS},
            "steps_by_depth": {k: v / args.trees for k, v in by_depth[first].items()
                               if k in depth_steps},
            "phe_baseline_tree_seconds": rows[-1][5],
            "by_key_bits": {str(b): {"tree_seconds": tree_seconds[b]} for b in bits_list},
            "by_scheme": by_scheme,
        }, indent=2) + "\n")


def print_rounds(by_round: dict[str, list[tuple[float, float]]], bits_list: list[int],
                 schemes: list[str]) -> None:
    """Each round's seconds per tree and its ratio to the first scheme's, and their median."""
    print("\nby round (order alternates): s/tree " + " / ".join(schemes) + ", ratio")
    for bits in bits_list:
        first = [seconds for seconds, _ in by_round[f"{bits}-{schemes[0]}"]]
        for scheme in schemes[1:]:
            other = [seconds for seconds, _ in by_round[f"{bits}-{scheme}"]]
            ratios = [a / b for a, b in zip(first, other, strict=True)]
            for r, (a, b, ratio) in enumerate(zip(first, other, ratios, strict=True)):
                print(f"  {bits} round {r + 1}: {a:.2f} / {b:.2f}  {ratio:.2f}x")
            print(f"  {bits} {scheme}: median {statistics.median(ratios):.2f}x, "
                  f"range {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
