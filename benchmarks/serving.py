"""The scoring service's speed: rows/s for batches of 100 ids and single-row latency.

    python -m benchmarks.serving [--json FILE] [--work DIR] [--url amqp://...] [--stand-in]

Each case trains a model over RabbitMQ on loopback with three parties (the lender and two data
providers of configs/default_credit_three_party.yaml, each a 'fedboost worker' process) with
'fedboost train', then serves it with 'fedboost serve-model' and asks it over HTTP:

  secureboost  configs/default_credit_three_party.yaml as 30 trees of depth 3, 2048-bit keys
  forest       configs/default_credit_forest.yaml's protocol and parameters (50 trees of depth
               10, the seed 002 serving setting) with the same three parties; skipped, saying
               so, where that config or its protocol is missing
  stand-in     (--stand-in) a SecureBoost model of 50 trees of depth 10: serving cost depends
               only on the trees' shape, so it checks the forest goal before the forest exists

Single rows: one client, one request at a time (p50/p99 ms). Batches: --clients concurrent
clients sending 100 random ids each (rows/s). ``--work DIR`` keeps keys and trained models, so
a second run only serves. ``--json FILE`` writes {"secureboost": {"rows_per_s", "p50_ms",
"p99_ms", ...}, "forest": {...}} (and "stand_in" with --stand-in).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import yaml

from messages.rabbitmq import delete_party_queues
from messages.signing import write_key_pair

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
BATCH = 100


def _parties() -> dict[str, Any]:
    raw = yaml.safe_load((CONFIGS / "default_credit_three_party.yaml").read_text())
    return {name: {**party, "data": str((CONFIGS / party["data"]).resolve())}
            for name, party in raw["parties"].items()}


def _case_job(case: str, url: str, work: Path, bits: int) -> dict[str, Any] | str:
    """The job file of a case, or why it is skipped."""
    if case == "forest":
        path = CONFIGS / "default_credit_forest.yaml"
        if not path.exists():
            return f"{path.name} is not in this checkout (the vertical forest protocol is not here)"
        raw = yaml.safe_load(path.read_text())
    else:
        raw = yaml.safe_load((CONFIGS / "default_credit_three_party.yaml").read_text())
        raw["params"] = {**raw["params"], "n_trees": 30 if case == "secureboost" else 50,
                         "max_depth": 3 if case == "secureboost" else 10}
    parties = {}
    for name, party in _parties().items():  # three parties, each a worker with its own file
        parties[name] = {"role": party["role"], "id": party["id"], "label": party.get("label")}
        if party.get("label") is None:
            del parties[name]["label"]
    raw.update(job=f"serving-bench-{case}", parties=parties,
               crypto={"key_bits": bits}, validation={"fraction": 0.0, "seed": 0},
               transport={"kind": "rabbitmq", "url": url, "step_timeout": 7200},
               signing={"key_dir": str(work / "keys")})
    return raw


def _worker_files(work: Path, url: str, bits: int, protocols: list[str]) -> list[Path]:
    files = []
    for name, party in _parties().items():
        raw = {"party": name, "data": party["data"], "id": party["id"],
               "models": str(work / "models"),
               "policy": {"min_key_bits": min(bits, 2048), "protocols": protocols,
                          "predict_modes": ["path", "batched"]},
               "transport": {"kind": "rabbitmq", "url": url},
               "signing": {"key_dir": str(work / "keys")}}
        for key in ("label", "columns"):
            if party.get(key) is not None:
                raw[key] = party[key]
        path = work / f"worker-{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        files.append(path)
        write_key_pair(work / "keys", name)
    write_key_pair(work / "keys", "flow")
    return files


@contextmanager
def _workers(work: Path, files: list[Path], url: str) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FEDBOOST_AMQP_URL": url}
    procs = [subprocess.Popen([*FEDBOOST, "worker", "--party", f.stem.removeprefix("worker-"),
                               "--config", str(f), "--log-level", "WARNING"],
                              stdout=(work / f"{f.stem}.log").open("a"),
                              stderr=subprocess.STDOUT, env=env, cwd=work) for f in files]
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=120)
        delete_party_queues(url, [f.stem.removeprefix("worker-") for f in files])


def _train(work: Path, case: str, job: dict[str, Any], url: str) -> Path:
    run = work / "runs" / case
    if (run / "metrics.json").exists():
        print(f"{case}: reusing the model trained in {run}", flush=True)
        return run
    path = work / f"job-{case}.yaml"
    path.write_text(yaml.safe_dump(job))
    print(f"{case}: training {job['params']['n_trees']} trees of depth "
          f"{job['params']['max_depth']} ({job['protocol']}) ...", flush=True)
    started = time.perf_counter()
    subprocess.run([*FEDBOOST, "train", str(path), "--out", str(run)], check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO), "FEDBOOST_AMQP_URL": url},
                   cwd=work)
    print(f"{case}: trained in {time.perf_counter() - started:.0f} s", flush=True)
    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _service(work: Path, run: Path, url: str, case: str, in_flight: int = 2) -> Iterator[str]:
    port = _free_port()
    log = work / f"serve-{case}.log"
    proc = subprocess.Popen([*FEDBOOST, "serve-model", str(run), "--port", str(port),
                             "--max-ids", str(BATCH), "--round-rows", "4096",
                             "--in-flight", str(in_flight)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO), "FEDBOOST_AMQP_URL": url},
                            cwd=work)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve-model exited: {log.read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve-model not ready: {log.read_text()}")
            time.sleep(0.3)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _single_latency(base: str, ids: list[str], n: int) -> tuple[float, float]:
    rng = random.Random(1)
    times = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for k in range(n + 50):
            started = time.perf_counter()
            reply = client.post("/v1/score", json={"ids": [rng.choice(ids)]})
            elapsed = time.perf_counter() - started
            reply.raise_for_status()
            if k >= 50:  # after a warm-up
                times.append(elapsed)
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)


def _batched_throughput(base: str, ids: list[str], clients: int, seconds: float) -> float:
    async def client(number: int, deadline: float, http: httpx.AsyncClient) -> int:
        rng = random.Random(number)
        rows = 0
        while time.perf_counter() < deadline:
            reply = await http.post("/v1/score", json={"ids": rng.sample(ids, BATCH)})
            reply.raise_for_status()
            rows += BATCH
        return rows

    async def run() -> float:
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
            await client(-1, time.perf_counter() + 1.0, http)  # warm-up
            started = time.perf_counter()
            done = await asyncio.gather(*(client(k, started + seconds, http)
                                          for k in range(clients)))
            return sum(done) / (time.perf_counter() - started)

    return asyncio.run(run())


def _measure(base: str, ids: list[str], args: argparse.Namespace) -> dict[str, Any]:
    p50, p99 = _single_latency(base, ids, args.singles)
    rows_per_s = _batched_throughput(base, ids, args.clients, args.seconds)
    health = httpx.get(f"{base}/healthz").json()
    return {"rows_per_s": round(rows_per_s, 1), "p50_ms": round(p50, 2),
            "p99_ms": round(p99, 2), "single_requests": args.singles,
            "batch_clients": args.clients, "rounds": health["rounds"],
            "requests": health["requests"]}


def _ids() -> list[str]:
    path = Path(_parties()["guest"]["data"])
    with path.open(newline="") as handle:
        return [row["id"] for row in csv.DictReader(handle)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--work", type=Path, help="keep keys and models here (default: a "
                        "temporary folder)")
    parser.add_argument("--url", default=os.environ.get(
        "FEDBOOST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--bits", type=int, default=2048)
    parser.add_argument("--stand-in", action="store_true",
                        help="also serve a SecureBoost model of 50 trees of depth 10")
    parser.add_argument("--stand-in-bits", type=int, default=1024,
                        help="key size the stand-in trains with (serving never uses keys)")
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=2,
                        help="serve-model --in-flight: scoring rounds out at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results = run_cases(work, args)
    empty = {"rows_per_s": None, "p50_ms": None, "p99_ms": None}
    print(f"\n{'case':<12} {'rows/s (batches of 100)':>24} {'p50 ms':>8} {'p99 ms':>8}")
    for case, r in results.items():
        if r.get("skipped"):
            print(f"{case:<12} skipped: {r['skipped']}")
        else:
            print(f"{case:<12} {r['rows_per_s']:>24,.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")
    if args.json:
        results.setdefault("forest", {**empty, "skipped": "not run"})
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def run_cases(work: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Train (or reuse) and serve each case; its measurements or why it was skipped."""
    cases = [("secureboost", args.bits), ("forest", args.bits)]
    if args.stand_in:
        cases.append(("stand_in", args.stand_in_bits))
    ids = _ids()
    results: dict[str, dict[str, Any]] = {}
    for case, bits in cases:
        job = _case_job(case, args.url, work, bits)
        if isinstance(job, str):
            print(f"{case}: skipped: {job}", flush=True)
            results[case] = {"rows_per_s": None, "p50_ms": None, "p99_ms": None, "skipped": job}
            continue
        files = _worker_files(work, args.url, bits, [job["protocol"]])
        with _workers(work, files, args.url):
            run = _train(work, case, job, args.url)
            with _service(work, run, args.url, case, args.in_flight) as base:
                results[case] = _measure(base, ids, args)
        print(f"{case}: {results[case]}", flush=True)
    return results


if __name__ == "__main__":
    main()
