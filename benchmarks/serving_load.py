"""The scoring service's load test: concurrent clients over HTTP(S), with API keys.

Used by ``benchmarks.serving``, which starts the workers and the service. ``Clients`` says how
to reach the service (base URL, the CA to trust, one API key per client); ``single_rows``
measures one client's one-row requests one at a time, ``batches`` N concurrent clients' requests
of 100 ids each for a while. Each reports latencies (p50/p99, ms, end to end in the client)
and the responses that were not 200 or never came (``errors``).
"""

from __future__ import annotations

import asyncio
import os
import random
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
    return [add_key(path, f"bench-{k}") for k in range(clients)]


def _summary(times: list[float], rows: int, seconds: float, errors: int,
             cpu: float) -> dict[str, Any]:
    ms = np.array(times) * 1e3 if times else np.array([np.nan])
    return {"rows_per_s": round(rows / seconds, 1) if seconds else None,
            "p50_ms": round(float(np.percentile(ms, 50)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "requests": len(times), "errors": errors,
            "service_cpu_ms_per_request": round(cpu * 1e3 / len(times), 3) if times else None}


def single_rows(clients: Clients, ids: list[str], warm_up: int = 50) -> dict[str, Any]:
    """One client, one id per request, one request at a time, every id once."""
    times, errors, cpu = [], 0, 0.0
    with httpx.Client(base_url=clients.base, verify=clients.verify(), headers=clients.headers(0),
                      timeout=30) as client:
        for k, ident in enumerate(ids):
            if k == warm_up:
                cpu = clients.cpu_seconds()
            started = time.perf_counter()
            try:
                ok = client.post("/v1/score", json={"ids": [ident]}).status_code == 200
            except httpx.HTTPError:
                ok = False
            elapsed = time.perf_counter() - started
            errors += not ok
            if k >= warm_up and ok:
                times.append(elapsed)
    return _summary(times, len(times), sum(times), errors, clients.cpu_seconds() - cpu)


def batches(clients: Clients, ids: list[str], concurrent: int, seconds: float) -> dict[str, Any]:
    """``concurrent`` clients (one connection and one key each) sending 100 random ids per
    request, as fast as answers come, for ``seconds`` after a second of warm-up."""

    async def client(number: int, start: float, deadline: float,
                     times: list[float]) -> tuple[int, int]:
        rng = random.Random(number)
        rows = errors = 0
        async with httpx.AsyncClient(base_url=clients.base, verify=clients.verify(),
                                     headers=clients.headers(number), timeout=60) as http:
            while (now := time.perf_counter()) < deadline:
                try:
                    reply = await http.post("/v1/score", json={"ids": rng.sample(ids, BATCH)})
                    ok = reply.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if now >= start:
                    times.append(time.perf_counter() - now)
                    rows += BATCH if ok else 0
                    errors += not ok
        return rows, errors

    async def run() -> dict[str, Any]:
        times: list[float] = []
        start = time.perf_counter() + 1.0
        cpu = [0.0]

        async def after_warm_up() -> None:
            await asyncio.sleep(1.0)
            cpu[0] = clients.cpu_seconds()

        done, _ = await asyncio.gather(
            asyncio.gather(*(client(k, start, start + seconds, times) for k in range(concurrent))),
            after_warm_up())
        elapsed = time.perf_counter() - start
        return _summary(times, sum(r for r, _ in done), elapsed, sum(e for _, e in done),
                        clients.cpu_seconds() - cpu[0])

    return asyncio.run(run())
