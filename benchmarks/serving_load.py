"""The scoring service's load test: concurrent clients over HTTP(S), with API keys.

Used by ``benchmarks.serving``, which starts the workers and the services. ``Clients`` says how
to reach a service (base URL, the CA to trust, one API key per client); ``single_rows``
measures one client's one-row requests one at a time, ``batches`` N concurrent clients' requests
of 100 ids each for a while. Each gives a ``Sample``: latencies (end to end in the client),
rows, the responses that were not 200 or never came (``errors``), and the CPU time the service
process spent; ``summary`` turns samples (several short ones, interleaved with another
service's so both see the same load from the machine's other users) into rows/s, p50/p99.
``wrk`` runs the independent load generator (``wrk`` with ``serving_wrk.lua``) against the same
service.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from fedboost.api_keys import add_key

REPO = Path(__file__).resolve().parents[1]
BATCH = 100


@dataclass
class Clients:
    """How clients reach the service: its URL, the CA to trust, each client's API key (and the
    service's process id, to read the CPU time it spends)."""

    base: str
    ca: Path | None = None
    keys: list[str] = field(default_factory=list)
    pid: int | None = None

    def cpu_seconds(self) -> float:
        """CPU time the service process has used (user + system): on a machine others load,
        its growth per request is steadier than wall-clock latency."""
        if self.pid is None:
            return 0.0
        with open(f"/proc/{self.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def headers(self, k: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[k % len(self.keys)]}"} if self.keys else {}

    def verify(self) -> Any:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca else True


def make_tls(folder: Path) -> Path:
    """A test CA and a certificate for localhost/127.0.0.1 (``deploy/make-certs.sh``)."""
    if not (folder / "server.pem").exists():
        subprocess.run(["sh", str(REPO / "deploy" / "make-certs.sh"), "-o", str(folder), "-s",
                        "localhost"], check=True, capture_output=True, timeout=120)
    return folder


def make_keys(path: Path, clients: int) -> list[str]:
    """A fresh keys file with one key per client."""
    path.unlink(missing_ok=True)
    # /healthz warms each connection up: the metrics scope too
    return [add_key(path, f"bench-{k}", scopes=("score", "metrics")) for k in range(clients)]


@dataclass
class Sample:
    """One measurement: request latencies (s), rows scored, wall and service CPU seconds."""

    times: list[float] = field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    errors: int = 0
    cpu: float = 0.0


def summary(samples: list[Sample]) -> dict[str, Any]:
    """Rows/s over the samples' wall time, latency percentiles (ms), errors, service CPU."""
    times = [t for s in samples for t in s.times]
    ms = np.array(times) * 1e3 if times else np.array([np.nan])
    seconds = sum(s.seconds for s in samples)
    return {"rows_per_s": round(sum(s.rows for s in samples) / seconds, 1) if seconds else None,
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "requests": len(times), "errors": sum(s.errors for s in samples),
            "service_cpu_ms_per_request": round(sum(s.cpu for s in samples) * 1e3 / len(times), 3)
            if times else None}


def single_rows(clients: Clients, ids: list[str]) -> Sample:
    """One client, one id per request, one request at a time, every id once."""
    sample = Sample()
    with httpx.Client(base_url=clients.base, verify=clients.verify(), headers=clients.headers(0),
                      timeout=30) as client:
        client.get("/healthz")  # the connection (and its TLS handshake) before the clock
        cpu = clients.cpu_seconds()
        for ident in ids:
            started = time.perf_counter()
            try:
                ok = client.post("/v1/score", json={"ids": [ident]}).status_code == 200
            except httpx.HTTPError:
                ok = False
            elapsed = time.perf_counter() - started
            sample.errors += not ok
            if ok:
                sample.times.append(elapsed)
                sample.rows += 1
                sample.seconds += elapsed
        sample.cpu = clients.cpu_seconds() - cpu
    return sample


def batches(clients: Clients, ids: list[str], concurrent: int, seconds: float,
            seed: int = 0) -> Sample:
    """``concurrent`` clients (one connection and one key each) sending 100 random ids per
    request, as fast as answers come, for ``seconds`` after half a second of warm-up."""

    async def client(number: int, start: float, deadline: float, sample: Sample) -> None:
        rng = random.Random(seed * 1000 + number)
        async with httpx.AsyncClient(base_url=clients.base, verify=clients.verify(),
                                     headers=clients.headers(number), timeout=60) as http:
            while (now := time.perf_counter()) < deadline:
                try:
                    reply = await http.post("/v1/score", json={"ids": rng.sample(ids, BATCH)})
                    ok = reply.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if now >= start:
                    sample.times.append(time.perf_counter() - now)
                    sample.rows += BATCH if ok else 0
                    sample.errors += not ok

    async def run() -> Sample:
        sample = Sample()
        start = time.perf_counter() + 0.5
        cpu = [0.0]

        async def after_warm_up() -> None:
            await asyncio.sleep(0.5)
            cpu[0] = clients.cpu_seconds()

        await asyncio.gather(after_warm_up(), *(client(k, start, start + seconds, sample)
                                                for k in range(concurrent)))
        sample.seconds = time.perf_counter() - start
        sample.cpu = clients.cpu_seconds() - cpu[0]
        return sample

    return asyncio.run(run())


WRK_SCRIPT = Path(__file__).with_name("serving_wrk.lua")


def wrk_available() -> str | None:
    """The ``wrk`` binary, or None (``apt-get install -y wrk`` on Debian)."""
    return shutil.which("wrk")


def wrk(clients: Clients, ids: list[str], *, mode: str, connections: int, threads: int,
        seconds: float, work: Path, key_offset: int = 0) -> dict[str, Any]:
    """An independent load generator against the service: ``wrk`` with
    ``serving_wrk.lua`` posting JSON with an API key, one id per request from ``ids`` in turn
    (``mode="single"``, each thread its own ids: never the same id twice while they last) or
    ``BATCH`` random ids of ``ids`` per request (``mode="batch"``). Its summary line, with
    rows/s and the service's CPU time per request."""
    binary = wrk_available()
    if binary is None:
        return {"skipped": "wrk is not installed (apt-get install -y wrk)"}
    work.mkdir(parents=True, exist_ok=True)
    id_file = work / f"wrk-ids-{mode}.txt"
    id_file.write_text("".join(f"{i}\n" for i in ids))
    keys = [clients.keys[(key_offset + k) % len(clients.keys)] for k in range(threads)
            ] if clients.keys else []
    env = {**os.environ, "FB_IDS": str(id_file), "FB_KEYS": ",".join(keys), "FB_MODE": mode,
           "FB_THREADS": str(threads), "FB_BATCH": str(BATCH)}
    cpu = clients.cpu_seconds()
    out = subprocess.run([binary, "-t", str(threads), "-c", str(connections), "-d",
                          f"{max(1, round(seconds))}s", "--timeout", "30s", "-s",
                          str(WRK_SCRIPT), f"{clients.base}/v1/score"], env=env,
                         capture_output=True, text=True, timeout=seconds + 120)
    cpu = clients.cpu_seconds() - cpu
    line = next((x for x in out.stdout.splitlines() if x.startswith("FBWRK ")), None)
    if out.returncode != 0 or line is None:
        return {"skipped": f"wrk failed ({out.returncode}): {(out.stderr or out.stdout)[-300:]}"}
    result: dict[str, Any] = json.loads(line[len("FBWRK "):])
    ok = result["requests"] - result["non_2xx"]
    rows = ok * (BATCH if mode == "batch" else 1)
    result.update(rows_per_s=round(rows / result["seconds"], 1) if result["seconds"] else None,
                  service_cpu_ms_per_request=round(cpu * 1e3 / result["requests"], 3)
                  if result["requests"] else None, connections=connections, threads=threads)
    for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
        result[key] = round(result[key], 2)
    return result
