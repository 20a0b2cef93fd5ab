"""Where a single row's time goes inside the scoring service's link: a trace, not a load test.

    python -m benchmarks.serving_trace RUN_DIR [--rows 300] [--ids CSV] [--url amqp://...]

Opens a scoring session at the running workers of a trained run folder (as 'fedboost
serve-model' does, but in this process and without HTTP) and asks rows one at a time: ids
never asked before (membership round, then scoring round) and the same again (scoring round
only). Each request's time is cut at: the round's envelopes sealed (msgpack and an Ed25519
signature each), published (each publish waits for the broker's confirm), each party's answer
received and opened (signature verified), the next round sent, the request's outcome. What HTTP,
TLS and JSON add is the difference to the same rows' latency over HTTPS
(``benchmarks.serving``). ``benchmarks.serving`` runs this on its models with ``--trace``.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedboost.scoring_link import ScoringLink
from fedboost.scoring_session import SessionPlan
from fedboost.serving import _datasets, _job_of
from flows.coordinator import broker_coordinator


class _Timed:
    """A sealer and a transport that add each call's time to ``spent``."""

    def __init__(self, inner: Any, spent: dict[str, float], names: dict[str, str]) -> None:
        self._inner, self._spent, self._names = inner, spent, names

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        label = self._names.get(name)
        if label is None or not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self._spent[label] += time.perf_counter() - started
        return timed


def trace(run: Path, ids: list[str], rows: int, url: str | None = None,
          seed: int = 3) -> dict[str, Any]:
    """Per phase, the median milliseconds of a request never asked before and of one found
    (``url``: the broker, else ``FEDBOOST_AMQP_URL``)."""
    if url:
        os.environ["FEDBOOST_AMQP_URL"] = url  # the job file names no broker password
    config = _job_of(run)
    plan = SessionPlan(job=f"{config.job[:40]}-trace-{uuid.uuid4().hex[:8]}",
                       model_job=config.job, protocol=config.protocol, active=config.active,
                       passives=list(config.passives), datasets=_datasets(config, []),
                       max_rows=4096, timeout=10.0)
    coordinator = broker_coordinator(config, plan.job, plan.timeout)
    spent: dict[str, float] = defaultdict(float)
    coordinator.sealer = _Timed(coordinator.sealer, spent,  # type: ignore[assignment]  # a timing proxy
                                {"seal": "seal", "open": "open"})
    marks: list[tuple[str, float]] = []

    class Traced(ScoringLink):
        def _send_round(self, requests: Any, ids: Any, kind: Any) -> None:
            marks.append((f"{kind.name.lower()} start", time.perf_counter()))
            super()._send_round(requests, ids, kind)
            marks.append((f"{kind.name.lower()} sent", time.perf_counter()))

        def _take_reply(self, env: Any, round_: Any) -> None:
            marks.append((f"{round_.kind.name.lower()} reply {env.sender}", time.perf_counter()))
            super()._take_reply(env, round_)

    link = Traced(plan, coordinator, max_in_flight=2)
    link.transport = _Timed(link.transport, spent, {"send": "publish"})  # type: ignore[assignment]  # a timing proxy
    link.open()
    link.start()
    picked = random.Random(seed).sample(ids, min(rows + 20, len(ids)))
    out: dict[str, Any] = {}
    try:
        for label, asked in (("warm-up", picked[rows:]), ("new", picked[:rows]),
                             ("found", picked[:rows])):
            phases: dict[str, list[float]] = defaultdict(list)
            for ident in asked:
                marks.clear()
                spent.clear()
                done = threading.Event()
                started = time.perf_counter()
                link.submit([ident], lambda outcome: done.set())
                done.wait(30)
                total = time.perf_counter() - started
                phases["total"].append(total)
                previous = started
                for name, at in marks:
                    phases[f"{name} (since previous mark)"].append(at - previous)
                    previous = at
                phases["outcome after last mark"].append(started + total - previous)
                for name, seconds in spent.items():
                    phases[f"in {name} (all calls)"].append(seconds)
            if label != "warm-up":
                out[label] = {name: round(float(np.median(v)) * 1e3, 3)
                              for name, v in phases.items()}
                out[label]["p99 total"] = round(float(np.percentile(phases["total"], 99)) * 1e3,
                                                3)
    finally:
        link.stop()
        coordinator.transport.delete_inbox()  # type: ignore[attr-defined]
        coordinator.transport.close()
    return out


def signing_ab(rounds: int = 7, n: int = 300) -> dict[str, float]:
    """Microseconds to sign and to verify a seal the way ``messages.signing`` did before (an
    Ed25519 key object made from raw bytes for every message) and does now (made once), in
    turns (best of ``rounds``)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                                   Ed25519PublicKey)

    from messages.signing import _signing_key, _verifying_key, generate_key, public_of

    private = generate_key()
    public = public_of(private)
    message = os.urandom(300)
    signature = _signing_key(private).sign(message)
    ways = {"sign_before_us": lambda: Ed25519PrivateKey.from_private_bytes(private).sign(message),
            "sign_now_us": lambda: _signing_key(private).sign(message),
            "verify_before_us": lambda: Ed25519PublicKey.from_public_bytes(public).verify(
                signature, message),
            "verify_now_us": lambda: _verifying_key(public).verify(signature, message)}
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, way in ways.items():
            started = time.perf_counter()
            for _ in range(n):
                way()
            best[name] = min(best[name], (time.perf_counter() - started) / n * 1e6)
    out = {name: round(us, 1) for name, us in best.items()}
    out["sign_now_vs_before"] = round(best["sign_now_us"] / best["sign_before_us"], 3)
    out["verify_now_vs_before"] = round(best["verify_now_us"] / best["verify_before_us"], 3)
    return out


def show(result: dict[str, Any]) -> None:
    for label, phases in result.items():
        print(f"row {label}: median ms per request")
        for name, ms in phases.items():
            print(f"  {name:<48} {ms:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder of 'fedboost train' over RabbitMQ")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--ids", type=Path, required=True,
                        help="a CSV whose 'id' column the parties hold (the lender's data file)")
    parser.add_argument("--url", default=os.environ.get("FEDBOOST_AMQP_URL"))
    args = parser.parse_args()
    if args.url:
        os.environ["FEDBOOST_AMQP_URL"] = args.url
    with args.ids.open(newline="") as handle:
        ids = [row["id"] for row in csv.DictReader(handle)]
    show(trace(args.run, ids, args.rows))
    print(f"signing, before / now: {signing_ab()}")


if __name__ == "__main__":
    main()
