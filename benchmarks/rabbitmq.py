"""RabbitMQ against the embedded default, and scaling a passive party out over processes.

    python -m benchmarks.rabbitmq [--trees 3] [--rounds 2] [--bits 2048] [--url amqp://...]

Each round runs default_credit three ways, same config and seed, in this order:
  rabbitmq-1  party workers started with 'fedboost worker' (host: one process)
  rabbitmq-2  the same with '--processes 2' for the host
  memory      the embedded default (host: 2 processes on in-memory queues)
Prints seconds per tree and the host's build-histograms seconds per tree (Prefect task run
times) per run and averaged over rounds (this machine's speed drifts, so the three kinds take
turns), then the RabbitMQ/memory cost ratio and the 1-process/2-process histogram speed-up, in
all and split into the tree's first level and the deeper ones.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.train import step_seconds
from fedboost import _prefect_env
from fedboost.local_workers import start_worker, stop_workers
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair

REPO = Path(__file__).resolve().parents[1]


def _job(tag: str, url: str, bits: int, trees: int, keys: Path) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "configs" / "default_credit.yaml").read_text())
    for party in raw["parties"].values():
        party["data"] = str((REPO / "configs" / party["data"]).resolve())
        party["policy"] = {"min_key_bits": min(bits, 2048)}  # benchmarks measure 1024 too
    raw["parties"] = {f"guest{tag}": raw["parties"]["guest"], f"host{tag}": raw["parties"]["host"]}
    raw["job"] = f"bench-{tag}"
    raw["params"]["n_trees"] = trees
    raw["crypto"]["key_bits"] = bits
    raw["transport"] = {"kind": "rabbitmq", "url": url}
    raw["signing"] = {"key_dir": str(keys)}
    for name in (*raw["parties"], "flow"):
        write_key_pair(keys, name)
    return raw


def start_workers(job_file: Path, models: Path, work: Path, processes: dict[str, int],
                  extra: tuple[str, ...] = (), log_level: str = "WARNING",
                  ) -> list[subprocess.Popen[bytes]]:
    """One 'fedboost worker' per party (``processes``: party -> its --processes), as an
    operator would start them (``fedboost.local_workers``); this checkout's code on their path."""
    return [start_worker(party, job_file, cwd=work,
                         args=["--models", str(models), "--processes", str(n), *extra,
                               "--log-level", log_level])
            for party, n in processes.items()]


def _measure(run: Any) -> dict[str, float]:
    state = run()
    result = state.result()
    steps = step_seconds(state.state_details.flow_run_id, by_depth=True)
    trees = len(result["tree_seconds"])
    first = steps.get("build-histograms-d0", 0.0)
    # with one data provider each deeper level is built in the apply-splits step above it
    deeper = sum(v for k, v in steps.items()
                 if k.startswith(("build-histograms-d", "apply-splits-d"))) - first
    return {"s/tree": sum(result["tree_seconds"]) / trees,
            "hist s/tree": (first + deeper) / trees,
            "hist d0 s/tree": first / trees, "hist deeper s/tree": deeper / trees,
            "train_auc": result["train_auc"]}


def _rabbit_run(url: str, bits: int, trees: int, host_processes: int, work: Path) -> dict[str, float]:
    from flows.config import load_config
    from flows.secureboost import vertical_secureboost

    tag = uuid.uuid4().hex[:6]
    job_file = work / f"job-{tag}.yaml"
    job_file.write_text(yaml.safe_dump(_job(tag, url, bits, trees, work / "keys")))
    procs = start_workers(job_file, work / "models", work,
                          {f"guest{tag}": 1, f"host{tag}": host_processes})
    try:
        config = load_config(job_file)
        return _measure(lambda: vertical_secureboost(config, return_state=True))
    finally:
        stop_workers(procs)
        delete_party_queues(url, [f"guest{tag}", f"host{tag}"])


def _memory_run(bits: int, trees: int, work: Path) -> dict[str, float]:
    from benchmarks.job_files import config_with
    from fedboost.embedded import party_specs, run_embedded
    from flows.secureboost import vertical_secureboost

    config = config_with("default_credit.yaml", crypto={"key_bits": bits}, params={"n_trees": trees})
    return _measure(lambda: run_embedded(config.job, party_specs(config, work / "memory"),
                                         lambda: vertical_secureboost(config, return_state=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    args = parser.parse_args()
    _prefect_env.configure()
    import logging

    for name in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    runs: dict[str, list[dict[str, float]]] = {"rabbitmq-1": [], "rabbitmq-2": [], "memory": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.rounds):
            runs["rabbitmq-1"].append(_rabbit_run(args.url, args.bits, args.trees, 1, work))
            runs["rabbitmq-2"].append(_rabbit_run(args.url, args.bits, args.trees, 2, work))
            runs["memory"].append(_memory_run(args.bits, args.trees, work))
    print(f"\ndefault_credit, {args.bits}-bit keys, {args.trees} trees per run, "
          f"{args.rounds} rounds")
    print(f"{'run':<12} {'s/tree':>8} {'host histograms s/tree':>24} {'train_auc':>10}")
    mean: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        for r in results:
            print(f"{name:<12} {r['s/tree']:>8.2f} {r['hist s/tree']:>24.2f} "
                  f"{r['train_auc']:>10.4f}")
        mean[name] = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
    for name, r in mean.items():
        print(f"{'mean ' + name:<12} {r['s/tree']:>8.2f} {r['hist s/tree']:>24.2f}")
    cost = mean["rabbitmq-2"]["s/tree"] / mean["memory"]["s/tree"]
    speedup = mean["rabbitmq-1"]["hist s/tree"] / mean["rabbitmq-2"]["hist s/tree"]
    print(f"\nRabbitMQ / in-memory seconds per tree (host 2 processes each): {cost:.3f}")
    print(f"host histograms, 1 process / 2 processes: {speedup:.2f}x faster with two")
    for part, label in (("hist d0 s/tree", "first level"), ("hist deeper s/tree", "deeper levels")):
        one, two = mean["rabbitmq-1"][part], mean["rabbitmq-2"][part]
        print(f"  {label}: {one:.2f} / {two:.2f} s/tree, {one / two:.2f}x")


if __name__ == "__main__":
    main()
