"""The scoring service's speed under load: rows/s, p50/p99 and errors at 1, 8 and 64 clients.

    python -m benchmarks.serving [--json FILE] [--work DIR] [--url amqp://...] [--stand-in]
                                 [--clients 1,8,64] [--seconds 10] [--repeats 4] [--singles 1000]

Each case trains a model over RabbitMQ on loopback with three parties (the lender and two data
providers of configs/default_credit_three_party.yaml, each a 'fedboost worker' process) with
'fedboost train', then serves it with two 'fedboost serve-model' processes at once: one over
HTTPS with one API key per client (as deployed), one over plain HTTP without authentication
('--insecure-no-auth', the baseline the ratios compare with). The two take turns in short
slices (100 single rows, or --seconds / --repeats of batches), so the load the machine's other
users add falls on both alike. Cases:

  secureboost  configs/default_credit_three_party.yaml as 30 trees of depth 3, 2048-bit keys
  forest       configs/default_credit_forest.yaml's protocol and parameters (50 trees of depth
               10, the seed 002 serving setting) with the same three parties; skipped, saying
               so, where that config or its protocol is missing
  stand-in     (--stand-in) a SecureBoost model of 50 trees of depth 10

Single rows: one client, one request at a time, --singles ids never asked before in the session
(each pays the membership round, as a new applicant does), then the same ids again (found
already: scored at once). Batches: 1, 8 and 64 concurrent clients (--clients), each with its
own connection and key, sending 100 random ids per request for --seconds (load test in
``benchmarks.serving_load``). ``--work DIR`` keeps keys and trained models, so a second run only
serves. ``--json FILE`` writes {"secureboost": {"rows_per_s", "p50_ms", "p99_ms", ...},
"forest": {...}}: the HTTPS-with-keys numbers (rows/s: the best of the client counts; p50/p99:
single rows never asked before), with every measurement under "https_keys" and "plain".
"""

from __future__ import annotations

import argparse
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import yaml

from benchmarks.serving_load import (BATCH, Clients, Sample, batches, make_keys, make_tls,
                                     single_rows, summary)
from fedboost.local_workers import start_worker, stop_workers, worker_env
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
MODES = ("https_keys", "plain")
SLICE_ROWS = 100
"""Single-row requests per slice: the two services take turns this often."""


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
    procs = [start_worker(f.stem.removeprefix("worker-"), f, log=work / f"{f.stem}.log",
                          append=True, cwd=work, env=worker_env(FEDBOOST_AMQP_URL=url),
                          args=["--log-level", "WARNING"]) for f in files]
    try:
        yield
    finally:
        stop_workers(procs, timeout=120)
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
def _service(work: Path, run: Path, url: str, case: str, mode: str, args: argparse.Namespace
             ) -> Iterator[Clients]:
    """'fedboost serve-model' of a trained case: over HTTPS with a key per client, plain, or
    (``before``) plain from the checkout in ``--compare-with``."""
    port = _free_port()
    log = work / f"serve-{case}-{mode}.log"
    code = args.compare_with if mode == "before" else REPO
    if mode == "https_keys":
        tls = make_tls(work / "tls")
        keys = make_keys(work / "api-keys.json", max(args.clients))
        flags = ["--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key"),
                 "--api-keys", str(work / "api-keys.json"), "--access-log", "off"]
        clients = Clients(f"https://127.0.0.1:{port}", tls / "ca.pem", keys)
    else:
        flags, clients = [], Clients(f"http://127.0.0.1:{port}")
        if "--insecure-no-auth" in (code / "fedboost" / "serving.py").read_text():
            flags = ["--insecure-no-auth", "--access-log", "off"]  # else: a version before
    proc = subprocess.Popen([sys.executable, "-m", "fedboost.cli", "serve-model", str(run),
                             "--port", str(port), "--max-ids", str(BATCH), "--round-rows",
                             "4096", "--in-flight", str(args.in_flight), *flags],
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(code), "FEDBOOST_AMQP_URL": url},
                            cwd=code)
    clients.pid = proc.pid
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve-model exited: {log.read_text()}")
            try:
                if _health(clients)["status"] == "ok":
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"serve-model not ready: {log.read_text()}")
            time.sleep(0.3)
        yield clients
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def _health(clients: Clients) -> dict[str, Any]:
    reply = httpx.get(f"{clients.base}/healthz", headers=clients.headers(0),
                      verify=clients.verify(), timeout=5)
    body: dict[str, Any] = reply.json()
    return body


def _measure(services: dict[str, Clients], ids: list[str],
             args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every measurement on both services in turn, in short slices, so the load the machine's
    other users put on it falls on both alike: single rows never asked before, the same again,
    then batches at each client count."""
    fresh = random.Random(1).sample(ids, args.singles + 50)
    for clients in services.values():  # warm-up: connections, code paths, not in the figures
        single_rows(clients, fresh[args.singles:])
    result: dict[str, dict[str, Any]] = {mode: {"clients": {}} for mode in services}
    for label in ("single_new", "single_found"):
        samples: dict[str, list[Sample]] = {mode: [] for mode in services}
        for k in range(0, args.singles, SLICE_ROWS):
            for mode, clients in services.items():
                samples[mode].append(single_rows(clients, fresh[k:k + SLICE_ROWS]))
        for mode in services:
            result[mode][label] = summary(samples[mode])
    for n in args.clients:
        samples = {mode: [] for mode in services}
        for repeat in range(args.repeats):
            for mode, clients in services.items():
                samples[mode].append(batches(clients, ids, n, args.seconds / args.repeats,
                                             seed=repeat))
        for mode in services:
            result[mode]["clients"][str(n)] = summary(samples[mode])
            print(f"  {mode}, {n:>3} clients: {result[mode]['clients'][str(n)]}", flush=True)
    for mode, clients in services.items():
        health = _health(clients)
        result[mode].update({k: health.get(k) for k in ("rounds", "membership_rounds",
                                                        "requests")})
    return result


def _ratio(secure: dict[str, Any], plain: dict[str, Any], what: str, key: str) -> float | None:
    def value(mode: dict[str, Any]) -> Any:
        part = mode["clients"][what[8:]] if what.startswith("clients_") else mode[what]
        return part.get(key)

    a, b = value(secure), value(plain)
    return round(a / b, 3) if a and b else None


def _headline(modes: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The case's --json keys: HTTPS-with-keys numbers, and their ratios to plain HTTP."""
    secure, plain = modes["https_keys"], modes["plain"]
    best = max(secure["clients"], key=lambda n: secure["clients"][n]["rows_per_s"] or 0)
    plain_best = max(c["rows_per_s"] or 0 for c in plain["clients"].values())
    rows = secure["clients"][best]["rows_per_s"]
    return {"rows_per_s": rows, "p50_ms": secure["single_new"]["p50_ms"],
            "p99_ms": secure["single_new"]["p99_ms"], "rows_per_s_clients": int(best),
            "found_p50_ms": secure["single_found"]["p50_ms"],
            "found_p99_ms": secure["single_found"]["p99_ms"],
            "single_requests": args.singles, "batch_clients": args.clients,
            "rounds": secure["rounds"], "requests": secure["requests"],
            "https_keys_vs_plain": {
                "rows_per_s": round(rows / plain_best, 3) if rows and plain_best else None,
                "p50_ms": round(secure["single_new"]["p50_ms"]
                                / plain["single_new"]["p50_ms"], 3),
                "service_cpu_per_request": {
                    what: _ratio(secure, plain, what, "service_cpu_ms_per_request")
                    for what in ("single_new", "single_found", *(
                        f"clients_{n}" for n in secure["clients"]))}},
            **modes}


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
    parser.add_argument("--cases", default="secureboost,forest",
                        help="which cases (default secureboost,forest)")
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--clients", type=lambda v: [int(c) for c in v.split(",")],
                        default=[1, 8, 64], help="concurrent client counts (default 1,8,64)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="seconds of batches per client count and service (default 10)")
    parser.add_argument("--repeats", type=int, default=4,
                        help="slices those seconds are cut into, the services taking turns")
    parser.add_argument("--compare-with", type=Path, metavar="DIR",
                        help="also serve plain from this checkout (e.g. 'git archive main'), in "
                             "turns with the others: the code before a change")
    parser.add_argument("--in-flight", type=int, default=2,
                        help="serve-model --in-flight: scoring rounds out at once")
    args = parser.parse_args()
    if args.compare_with is not None:
        args.compare_with = args.compare_with.resolve()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results = run_cases(work, args)
    loads = [round(load, 1), round(os.getloadavg()[0], 1)]
    print(f"\n1-minute load average before and after: {loads[0]} / {loads[1]}")
    print(f"{'case':<12} {'mode':<11} {'rows/s (best)':>14} {'new row p50/p99':>16} "
          f"{'found p50/p99':>14}  per clients: rows/s p50/p99 ms errors")
    for case, r in results.items():
        if r.get("skipped"):
            print(f"{case:<12} skipped: {r['skipped']}")
            continue
        r["load"] = loads
        for mode in [m for m in (*MODES, "before") if m in r]:
            m = r[mode]
            best = max(c["rows_per_s"] or 0 for c in m["clients"].values())
            levels = "; ".join(f"{n}: {c['rows_per_s']:,.0f} {c['p50_ms']:.1f}/"
                               f"{c['p99_ms']:.1f} {c['errors']}" for n, c in m["clients"].items())
            print(f"{case:<12} {mode:<11} {best:>14,.0f} {m['single_new']['p50_ms']:>7.2f}/"
                  f"{m['single_new']['p99_ms']:<8.2f} {m['single_found']['p50_ms']:>6.2f}/"
                  f"{m['single_found']['p99_ms']:<7.2f}  {levels}")
        print(f"{case:<12} https+keys / plain: {r['https_keys_vs_plain']}")
    if args.json:
        empty = {"rows_per_s": None, "p50_ms": None, "p99_ms": None}
        results.setdefault("forest", {**empty, "skipped": "not run"})
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def run_cases(work: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Train (or reuse) and serve each case; its measurements or why it was skipped."""
    cases = [(c, args.bits) for c in args.cases.split(",")]
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
            print(f"{case}: serving over HTTPS with keys and over plain HTTP, in turns",
                  flush=True)
            with ExitStack() as services:
                modes = _measure({mode: services.enter_context(
                    _service(work, run, args.url, case, mode, args)) for mode in (
                        *MODES, *(["before"] if args.compare_with else []))}, ids, args)
            results[case] = _headline(modes, args)
        print(f"{case}: {json.dumps({k: v for k, v in results[case].items() if k not in MODES})}",
              flush=True)
    return results


if __name__ == "__main__":
    main()
