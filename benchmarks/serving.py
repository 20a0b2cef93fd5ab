"""The scoring service's speed over HTTPS with API keys: rows/s, p50/p99, errors; and wrk's.

    python -m benchmarks.serving [--json FILE] [--work DIR] [--url amqp://...] [--stand-in]
                                 [--baseline REV | --compare-with DIR] [--cases secureboost,forest]
                                 [--clients 8,64] [--seconds 6] [--repeats 3] [--singles 600]
                                 [--wrk-seconds 8] [--trace 200] [--bits 1024]

Each case trains a model over RabbitMQ on loopback with three parties (the lender and two data
providers of configs/default_credit_three_party.yaml, each a 'fedboost worker' process) with
'fedboost train', then serves it with 'fedboost serve-model' processes at once: one over HTTPS
with one API key per client (as deployed), one over plain HTTP without authentication
('--insecure-no-auth'), and with ``--baseline REV`` (the code of a git revision, extracted with
'git archive' into a temporary folder) or ``--compare-with DIR`` (a checkout) one more over HTTPS
with the same keys from that code ("before"): the A/B of a change. They take turns in short
slices (100 single rows, or --seconds / --repeats of batches), so the load the machine's other
users add falls on all alike. Cases:

  secureboost  configs/default_credit_three_party.yaml as 30 trees of depth 3
  forest       configs/default_credit_forest.yaml's protocol and parameters (50 trees of depth
               10, the seed 002 serving setting) with the same three parties; skipped, saying
               so, where that config or its protocol is missing
  stand-in     (--stand-in) a SecureBoost model of 50 trees of depth 10

Keys are --bits (default 1024: serving never uses them, training is 3-4x quicker than 2048).

Single rows (httpx): one client, one request at a time, --singles ids never asked before in the
session (each pays the membership round, as a new applicant does), then the same ids again
(found already: scored at once). Then wrk (``benchmarks/serving_wrk.lua``: JSON with an API key
header), the independent load generator, against the same services in turns: one connection,
one fresh id per request (ids neither httpx nor wrk asked before) for --wrk-seconds, then found
ids. Batches: --clients concurrent httpx clients, each with its own connection and key, sending
100 random ids per request for --seconds (``benchmarks.serving_load``), then wrk with 64
connections doing the same. Where a new row's time goes comes from each service's /metrics
(its request time, the parties' answers to membership and scoring rounds) and, with --trace,
from a link in this process timed phase by phase (``benchmarks.serving_trace``).

Its lines on purpose: one benchmark command read top to bottom (set-up, the services in turns,
httpx and wrk, the report); its load generators already live in ``benchmarks.serving_load``.

``--work DIR`` keeps keys and trained models, so a second run only serves. ``--json FILE`` writes
{"secureboost": {"rows_per_s", "p50_ms", "p99_ms", "wrk": {...}, ...}, "forest": {...},
"load": {"start": [1, 5, 15 min], "end": [...]}}: the HTTPS-with-keys numbers (rows/s: the best
of the client counts; p50/p99: single rows never asked before), with every measurement under
"https_keys", "plain" (and "before").
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
import numpy as np
import yaml

from benchmarks.serving_load import (BATCH, Clients, Sample, batches, make_keys, make_tls,
                                     single_rows, summary, wrk)
from fedboost.local_workers import start_worker, stop_workers, worker_env
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair
from workers.model_folder import RunFolder

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
FEDBOOST = [sys.executable, "-m", "fedboost.cli"]
MODES = ("https_keys", "plain")
SLICE_ROWS = 100
"""Single-row requests per slice: the services take turns this often."""
WRK_CONNECTIONS = 64
"""wrk's connections for batches (two threads, a key each)."""


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
    if RunFolder(run).metrics.exists():
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
def _service(work: Path, run: Path, url: str, case: str, mode: str, args: argparse.Namespace,
             keys: list[str]) -> Iterator[Clients]:
    """'fedboost serve-model' of a trained case: over HTTPS with a key per client, plain, or
    (``before``) from the checkout in ``--compare-with``/``--baseline``, over HTTPS with the
    same keys where that code has them."""
    port = _free_port()
    log = work / f"serve-{case}-{mode}.log"
    code = args.compare_with if mode == "before" else REPO
    secure = mode == "https_keys" or (
        mode == "before" and "--api-keys" in (code / "fedboost" / "serving.py").read_text())
    if secure:
        tls = make_tls(work / "tls")
        flags = ["--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key"),
                 "--api-keys", str(work / "api-keys.json"), "--access-log", "off"]
        clients = Clients(f"https://127.0.0.1:{port}", tls / "ca.pem", keys)
    else:
        flags, clients = [], Clients(f"http://127.0.0.1:{port}")
        if "--insecure-no-auth" in (code / "fedboost" / "serving.py").read_text():
            flags = ["--insecure-no-auth", "--access-log", "off"]  # else: a version before
    proc = subprocess.Popen([sys.executable, "-m", "fedboost.cli", "serve-model", str(run),
                             "--port", str(port), "--max-ids", str(BATCH), "--round-rows",
                             "4096", "--in-flight", str(args.in_flight), "--timeout",
                             str(args.timeout), *flags],
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


def _scraped(clients: Clients) -> dict[str, float]:
    """Each service's own timings (``/metrics``: sums and counts of its histograms), {} where
    it has none: the /v1/score request time, and each party's answers to membership ("find")
    and scoring ("score") rounds."""
    try:
        reply = httpx.get(f"{clients.base}/metrics", headers=clients.headers(0),
                          verify=clients.verify(), timeout=5)
    except httpx.HTTPError:
        return {}
    if reply.status_code != 200:
        return {}
    values: dict[str, float] = {}
    for line in reply.text.splitlines():
        if line.startswith("fedboost_scoring_request_seconds_") and 'path="/v1/score"' in line:
            name = line.split("{")[0].rsplit("_", 1)[1]
            if name in ("sum", "count"):
                values[f"request_{name}"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("fedboost_scoring_party_round_seconds_") and "{" in line:
            name = line.split("{")[0].rsplit("_", 1)[1]
            if name not in ("sum", "count"):
                continue
            labels = dict(part.split("=", 1) for part in line.split("{")[1].split("}")[0]
                          .split(","))
            party, kind = labels["party"].strip('"'), labels["kind"].strip('"')
            values[f"{kind}:{party}_{name}"] = float(line.rsplit(" ", 1)[1])
    return values


def _breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Mean milliseconds per request between two scrapes: the service's own request time and,
    per party, the time from sending a round to its answer, by round kind."""
    def mean(key: str) -> float | None:
        n = after.get(f"{key}_count", 0) - before.get(f"{key}_count", 0)
        total = after.get(f"{key}_sum", 0) - before.get(f"{key}_sum", 0)
        return round(total * 1e3 / n, 2) if n > 0 else None

    keys = sorted({k.rsplit("_", 1)[0] for k in after if ":" in k})
    return {"service_request_ms": mean("request"),
            **{f"{k.split(':')[0]}_round_ms": {
                kk.split(":")[1]: mean(kk) for kk in keys if kk.startswith(k.split(":")[0] + ":")}
               for k in keys}}


def _single_phase(services: dict[str, Clients], ids: list[str]) -> dict[str, dict[str, Any]]:
    """Single rows of ``ids`` on every service, in slices, turn by turn; each service's
    timings from its /metrics over the phase beside the client's."""
    samples: dict[str, list[Sample]] = {mode: [] for mode in services}
    scraped = {mode: _scraped(clients) for mode, clients in services.items()}
    for k in range(0, len(ids), SLICE_ROWS):
        for mode, clients in services.items():
            samples[mode].append(single_rows(clients, ids[k:k + SLICE_ROWS]))
    return {mode: {**summary(samples[mode]), "mean_ms": round(1e3 * float(np.mean(
        [t for s in samples[mode] for t in s.times] or [np.nan])), 2),
        "where": _breakdown(scraped[mode], _scraped(clients))}
        for mode, clients in services.items()}


def _wrk_phase(services: dict[str, Clients], ids: list[str], args: argparse.Namespace,
               work: Path, mode: str, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """wrk against every service in turn (halves of --wrk-seconds each, so the machine's
    other load falls on all); in single mode each slice takes ids none before it took."""
    parts: dict[str, list[dict[str, Any]]] = {m: [] for m in services}
    slices = 2
    chunk = len(ids) // slices
    for k in range(slices):
        part = ids[k * chunk:(k + 1) * chunk] if mode == "single" else ids
        for name, clients in services.items():
            parts[name].append(wrk(clients, part, mode=mode, seconds=args.wrk_seconds / slices,
                                   work=work, **kwargs))
    merged: dict[str, dict[str, Any]] = {}
    for name, runs in parts.items():
        if any("skipped" in r for r in runs):
            merged[name] = next(r for r in runs if "skipped" in r)
            continue
        seconds = sum(r["seconds"] for r in runs)
        merged[name] = {
            "requests": sum(r["requests"] for r in runs),
            "non_2xx": sum(r["non_2xx"] for r in runs),
            "socket_errors": sum(r["socket_errors"] for r in runs),
            "wrapped": any(r["wrapped"] for r in runs),
            "rows_per_s": round(sum(r["rows_per_s"] * r["seconds"] for r in runs) / seconds, 1),
            # wrk gives percentiles per run, not its samples: the slices' mean, and the worst
            "p50_ms": round(float(np.mean([r["p50_ms"] for r in runs])), 2),
            "p99_ms": round(float(np.mean([r["p99_ms"] for r in runs])), 2),
            "p99_ms_worst_slice": max(r["p99_ms"] for r in runs),
            "service_cpu_ms_per_request": round(float(np.mean(
                [r["service_cpu_ms_per_request"] or 0 for r in runs])), 3),
            "connections": runs[0]["connections"], "seconds": round(seconds, 1)}
    return merged


def _measure(services: dict[str, Clients], ids: list[str], args: argparse.Namespace,
             work: Path) -> dict[str, dict[str, Any]]:
    """Every measurement on every service in turn, in short slices, so the load the machine's
    other users put on it falls on all alike: single rows never asked before, the same again,
    wrk's single rows (never asked before, then found), then batches at each client count and
    wrk's batches. Batches of random ids ask nearly every id: fresh ids come first."""
    shuffled = random.Random(1).sample(ids, len(ids))
    warm, fresh = shuffled[:50], shuffled[50:50 + args.singles]
    wrk_fresh = shuffled[50 + args.singles:]
    for clients in services.values():  # warm-up: connections, code paths, not in the figures
        single_rows(clients, warm)
    result: dict[str, dict[str, Any]] = {mode: {"clients": {}, "wrk": {}} for mode in services}
    for label in ("single_new", "single_found"):
        for mode, measured in _single_phase(services, fresh).items():
            result[mode][label] = measured
            print(f"  {mode}, {label}: {measured}", flush=True)
    if args.wrk_seconds > 0:
        for label, part in (("single_new", wrk_fresh), ("single_found", fresh)):
            for mode, measured in _wrk_phase(services, part, args, work, "single",
                                             connections=1, threads=1).items():
                result[mode]["wrk"][label] = measured
                print(f"  {mode}, wrk {label}: {measured}", flush=True)
    for n in args.clients:
        samples: dict[str, list[Sample]] = {mode: [] for mode in services}
        for repeat in range(args.repeats):
            for mode, clients in services.items():
                samples[mode].append(batches(clients, ids, n, args.seconds / args.repeats,
                                             seed=repeat))
        for mode in services:
            result[mode]["clients"][str(n)] = summary(samples[mode])
            print(f"  {mode}, {n:>3} clients: {result[mode]['clients'][str(n)]}", flush=True)
    if args.wrk_seconds > 0:
        for mode, measured in _wrk_phase(services, ids, args, work, "batch",
                                         connections=WRK_CONNECTIONS, threads=2).items():
            result[mode]["wrk"][f"batch_{WRK_CONNECTIONS}"] = measured
            print(f"  {mode}, wrk batches, {WRK_CONNECTIONS} connections: {measured}", flush=True)
    for mode, clients in services.items():
        health = _health(clients)
        result[mode].update({k: health.get(k) for k in ("rounds", "membership_rounds",
                                                        "requests", "failed")})
    return result


def _ratio(secure: dict[str, Any], plain: dict[str, Any], what: str, key: str) -> float | None:
    def value(mode: dict[str, Any]) -> Any:
        part = mode["clients"][what[8:]] if what.startswith("clients_") else mode[what]
        return part.get(key)

    a, b = value(secure), value(plain)
    return round(a / b, 3) if a and b else None


def _vs(secure: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Ratios of the HTTPS-with-keys service's numbers to another's in the same run (below 1:
    faster or cheaper; rows/s above 1: more)."""
    def best(mode: dict[str, Any]) -> float:
        return max(c["rows_per_s"] or 0 for c in mode["clients"].values())

    def over(a: Any, b: Any) -> float | None:
        return round(a / b, 3) if a and b else None

    ratios: dict[str, Any] = {"rows_per_s": over(best(secure), best(other))}
    for label in ("single_new", "single_found"):
        for key in ("p50_ms", "p99_ms", "service_cpu_ms_per_request"):
            ratios[f"{label}_{key}"] = over(secure[label][key], other[label][key])
    for label, measured in secure.get("wrk", {}).items():
        theirs = other.get("wrk", {}).get(label, {})
        for key in ("p50_ms", "p99_ms", "rows_per_s"):
            ratios[f"wrk_{label}_{key}"] = over(measured.get(key), theirs.get(key))
    ratios["service_cpu_per_request"] = {
        what: _ratio(secure, other, what, "service_cpu_ms_per_request")
        for what in ("single_new", "single_found", *(f"clients_{n}" for n in secure["clients"]))}
    return ratios


def _headline(modes: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The case's --json keys: HTTPS-with-keys numbers, and their ratios to the others."""
    secure = modes["https_keys"]
    best = max(secure["clients"], key=lambda n: secure["clients"][n]["rows_per_s"] or 0)
    wrk_runs = secure.get("wrk", {})
    return {"rows_per_s": secure["clients"][best]["rows_per_s"],
            "p50_ms": secure["single_new"]["p50_ms"], "p99_ms": secure["single_new"]["p99_ms"],
            "rows_per_s_clients": int(best),
            "found_p50_ms": secure["single_found"]["p50_ms"],
            "found_p99_ms": secure["single_found"]["p99_ms"],
            "wrk_rows_per_s": wrk_runs.get(f"batch_{WRK_CONNECTIONS}", {}).get("rows_per_s"),
            "wrk_p50_ms": wrk_runs.get("single_new", {}).get("p50_ms"),
            "wrk_p99_ms": wrk_runs.get("single_new", {}).get("p99_ms"),
            "wrk_found_p50_ms": wrk_runs.get("single_found", {}).get("p50_ms"),
            "wrk_found_p99_ms": wrk_runs.get("single_found", {}).get("p99_ms"),
            "single_requests": args.singles, "batch_clients": args.clients,
            "rounds": secure["rounds"], "requests": secure["requests"],
            "where_new_row_ms": secure["single_new"]["where"],
            "https_keys_vs_plain": _vs(secure, modes["plain"]),
            **({"https_keys_vs_before": _vs(secure, modes["before"])} if "before" in modes
               else {}),
            **modes}


def _ids() -> list[str]:
    path = Path(_parties()["guest"]["data"])
    with path.open(newline="") as handle:
        return [row["id"] for row in csv.DictReader(handle)]


def _loads() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def _baseline(args: argparse.Namespace) -> Iterator[None]:
    """``--baseline REV``: that revision's code in a temporary folder, as ``--compare-with``."""
    if args.baseline is None:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="serving-baseline-") as folder:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        args.compare_with = Path(folder)
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--work", type=Path, help="keep keys and models here (default: a "
                        "temporary folder)")
    parser.add_argument("--url", default=os.environ.get(
        "FEDBOOST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    parser.add_argument("--bits", type=int, default=1024,
                        help="key size the models train with (serving never uses keys)")
    parser.add_argument("--stand-in", action="store_true",
                        help="also serve a SecureBoost model of 50 trees of depth 10")
    parser.add_argument("--stand-in-bits", type=int, default=1024,
                        help="key size the stand-in trains with (serving never uses keys)")
    parser.add_argument("--cases", default="secureboost,forest",
                        help="which cases (default secureboost,forest)")
    parser.add_argument("--singles", type=int, default=600,
                        help="single rows never asked before, one at a time (default 600)")
    parser.add_argument("--clients", type=lambda v: [int(c) for c in v.split(",")],
                        default=[8, 64], help="concurrent client counts (default 8,64)")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="seconds of batches per client count and service (default 6)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="slices those seconds are cut into, the services taking turns")
    parser.add_argument("--wrk-seconds", type=float, default=8.0,
                        help="seconds of each wrk run per service (default 8; 0: no wrk)")
    before = parser.add_mutually_exclusive_group()
    before.add_argument("--baseline", metavar="REV", help="also serve the code of this git "
                        "revision (e.g. the commit before a change), over HTTPS with the same "
                        "keys, in turns with the others: the A/B of a change")
    before.add_argument("--compare-with", type=Path, metavar="DIR",
                        help="the same from a checkout (e.g. 'git archive main')")
    parser.add_argument("--trace", type=int, default=200, metavar="ROWS",
                        help="then trace ROWS single rows inside a link in this process "
                             "(benchmarks.serving_trace; default 200, 0: none)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="serve-model --timeout (default 30: opening the session indexes "
                             "30,000 rows at each party, over 10 s on a loaded machine)")
    parser.add_argument("--in-flight", type=int, default=2,
                        help="serve-model --in-flight: scoring rounds out at once")
    args = parser.parse_args()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM (e.g. timeout(1)) cleans up as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupted)
    if args.compare_with is not None:
        args.compare_with = args.compare_with.resolve()
    load = _loads()
    print(f"load average (1, 5, 15 min) at the start: {load}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, _baseline(args):
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        results: dict[str, Any] = run_cases(work, args)
    loads = {"start": load, "end": _loads()}
    print(f"\nload average (1, 5, 15 min) at the start: {loads['start']}, at the end: "
          f"{loads['end']}")
    print(f"{'case':<12} {'mode':<11} {'rows/s (best)':>14} {'new row p50/p99':>16} "
          f"{'found p50/p99':>14}  wrk: new p50/p99, found p50/p99, rows/s")
    for case, r in results.items():
        if r.get("skipped"):
            print(f"{case:<12} skipped: {r['skipped']}")
            continue
        for mode in [m for m in (*MODES, "before") if m in r]:
            m = r[mode]
            best = max(c["rows_per_s"] or 0 for c in m["clients"].values())
            w = m.get("wrk", {})

            def shown(label: str, key: str) -> str:
                value = w.get(label, {}).get(key)
                return "-" if value is None else f"{value:,.2f}"

            print(f"{case:<12} {mode:<11} {best:>14,.0f} {m['single_new']['p50_ms']:>7.2f}/"
                  f"{m['single_new']['p99_ms']:<8.2f} {m['single_found']['p50_ms']:>6.2f}/"
                  f"{m['single_found']['p99_ms']:<7.2f}  {shown('single_new', 'p50_ms')}/"
                  f"{shown('single_new', 'p99_ms')}, {shown('single_found', 'p50_ms')}/"
                  f"{shown('single_found', 'p99_ms')}, "
                  f"{shown(f'batch_{WRK_CONNECTIONS}', 'rows_per_s')}")
        print(f"{case:<12} new row, where (mean ms): {r['where_new_row_ms']}")
        for other in ("plain", "before"):
            if f"https_keys_vs_{other}" in r:
                print(f"{case:<12} https+keys / {other}: {r[f'https_keys_vs_{other}']}")
    results["load"] = loads
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
    keys = make_keys(work / "api-keys.json", max(*args.clients, 2))
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
            served = (*MODES, *(["before"] if args.compare_with else []))
            print(f"{case}: serving ({', '.join(served)}) in turns; load average "
                  f"{_loads()}", flush=True)
            with ExitStack() as services:
                modes = _measure({mode: services.enter_context(
                    _service(work, run, args.url, case, mode, args, keys)) for mode in served},
                    ids, args, work)
            results[case] = _headline(modes, args)
            if args.trace:
                from benchmarks.serving_trace import show, signing_ab, trace

                results[case]["trace"] = trace(run, ids, args.trace, args.url)
                results[case]["signing_us"] = signing_ab()
                print(f"{case}: inside the link (in this process, this checkout's code):")
                show(results[case]["trace"])
                print(f"{case}: signing, before / now: {results[case]['signing_us']}")
            results[case]["load_after"] = _loads()
        print(f"{case}: {json.dumps({k: v for k, v in results[case].items() if k not in (*MODES, 'before')})}",
              flush=True)
    return results


if __name__ == "__main__":
    main()
