"""Scaling the active party out over processes: a tree's encryption with one guest process or two.

    python -m benchmarks.active_scale [--trees 3] [--rounds 3] [--bits 2048] [--no-make-ahead]
                                      [--url amqp://...]

Each round trains default_credit over RabbitMQ twice, same config and seed, guest workers
started with 'fedboost worker --crypto-processes 1' (each guest process encrypts and decrypts
on one core of its own):
  guest-1  one guest process
  guest-2  two guest processes (the second takes encryption and decryption shards)
The host runs one process in both. In a deployment each further guest process runs on another
machine of the guest's organisation and brings its own cores; on one machine, one crypto core
per process shows the same thing honestly: two processes have twice the cores, not more.
Prints the guest's encrypt-gradients and find-splits seconds per tree (Prefect task run times)
of every run, their means, and the 1-process/2-process ratio of the means and of the fastest
runs; asserts every run's guest model file is byte-identical. ``--no-make-ahead`` starts the
guest workers with ``--no-make-ahead``: every obfuscator is made in the encryption step, which
is then all CPU work, so the split of that work is what the ratio shows (with obfuscators made
ahead on idle cores, a tree's encryption after the first is mostly sending, see
docs/performance.md).
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.rabbitmq import _job, start_workers
from benchmarks.train import step_seconds
from fedboost import _prefect_env
from fedboost.local_workers import stop_workers
from messages.rabbit_queues import delete_party_queues
from workers.model_folder import ModelPart


def _run(url: str, bits: int, trees: int, guest_processes: int, work: Path,
         extra: tuple[str, ...] = ()) -> tuple[dict[str, float], bytes]:
    """One training run; its guest's step seconds per tree and its model file."""
    from flows.config import load_config
    from flows.secureboost import vertical_secureboost

    tag = uuid.uuid4().hex[:6]
    raw: dict[str, Any] = _job(tag, url, bits, trees, work / "keys")
    raw["job"] = "bench-active"  # the same job name in every run: model files comparable
    job_file = work / f"job-{tag}.yaml"
    job_file.write_text(yaml.safe_dump(raw))
    models = work / f"models-{tag}"
    procs = start_workers(job_file, models, work,
                          {f"guest{tag}": guest_processes, f"host{tag}": 1},
                          extra=("--crypto-processes", "1", *extra))
    try:
        config = load_config(job_file)
        state = vertical_secureboost(config, return_state=True)
        result = state.result()
        steps = step_seconds(state.state_details.flow_run_id, by_tree=True)
        n = len(result["tree_seconds"])
        later = [steps[f"encrypt-gradients-t{t}"] for t in range(1, n)]
        seconds = {"encrypt s/tree": sum(steps[f"encrypt-gradients-t{t}"] for t in range(n)) / n,
                   "encrypt after t0": sum(later) / max(1, len(later)),
                   "find-splits s/tree": sum(v for k, v in steps.items()
                                             if k.startswith("find-splits-")) / n,
                   "s/tree": sum(result["tree_seconds"]) / n}
        model = ModelPart(models / "bench-active" / f"guest{tag}").model.read_bytes()
        return seconds, model.replace(tag.encode(), b"<tag>")  # party names: this run's own
    finally:
        stop_workers(procs)
        delete_party_queues(url, [f"guest{tag}", f"host{tag}"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--no-make-ahead", action="store_true",
                        help="guest workers make every obfuscator in the encryption step")
    args = parser.parse_args()
    extra = ("--no-make-ahead",) if args.no_make_ahead else ()
    _prefect_env.configure()
    import logging

    for name in ("prefect", "prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).setLevel(logging.WARNING)
    runs: dict[str, list[dict[str, float]]] = {"guest-1": [], "guest-2": []}
    models: set[bytes] = set()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.rounds):
            for name, processes in (("guest-1", 1), ("guest-2", 2)):
                seconds, model = _run(args.url, args.bits, args.trees, processes, work, extra)
                runs[name].append(seconds)
                models.add(model)
    print(f"\ndefault_credit, {args.bits}-bit keys, {args.trees} trees per run, "
          f"{args.rounds} rounds, one crypto core per guest process"
          + (", no obfuscators made ahead" if args.no_make_ahead else ""))
    print(f"{'run':<10} {'encrypt s/tree':>15} {'after t0':>9} {'find-splits s/tree':>19} "
          f"{'s/tree':>8}")
    mean: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        for r in results:
            print(f"{name:<10} {r['encrypt s/tree']:>15.2f} {r['encrypt after t0']:>9.2f} "
                  f"{r['find-splits s/tree']:>19.2f} {r['s/tree']:>8.2f}")
        mean[name] = {k: sum(r[k] for r in results) / len(results) for k in results[0]}
    for name, r in mean.items():
        print(f"{'mean ' + name:<10} {r['encrypt s/tree']:>15.2f} {r['encrypt after t0']:>9.2f} "
              f"{r['find-splits s/tree']:>19.2f} {r['s/tree']:>8.2f}")
    one, two = mean["guest-1"], mean["guest-2"]
    print(f"\nencrypt gradients, 1 guest process / 2: "
          f"{one['encrypt s/tree'] / two['encrypt s/tree']:.2f}x faster with two")
    print(f"  trees after the first (whose encryption also starts each process's crypto "
          f"processes): {one['encrypt after t0'] / two['encrypt after t0']:.2f}x")
    print(f"decryption (find splits), 1 / 2: "
          f"{one['find-splits s/tree'] / two['find-splits s/tree']:.2f}x")
    print(f"seconds per tree, 1 guest process / 2: {one['s/tree'] / two['s/tree']:.2f}x")
    best = {name: min(r["encrypt after t0"] for r in results) for name, results in runs.items()}
    print(f"trees after the first, fastest run of each (the least disturbed by other load): "
          f"{best['guest-1']:.2f} / {best['guest-2']:.2f} s/tree, "
          f"{best['guest-1'] / best['guest-2']:.2f}x")
    assert len(models) == 1, "the guest's model differs between runs"
    print("guest model.json byte-identical in every run")


if __name__ == "__main__":
    main()
