"""The scoring link alone, this checkout's against a git revision's, in turns in one process.

    python -m benchmarks.serving_link_ab --work DIR [--before REV] [--seconds 10] [--turns 2]

Uses the SecureBoost model ``python -m benchmarks.serving --work DIR`` trained (and its worker
files), starts the three workers, and opens a link (no HTTP) of each version in turn: one
client asks single rows never asked before back to back for --seconds. Prints, per turn, the
requests answered, their median time, and how often the link asked the broker whether every
party's worker is connected (the watch) while they ran. Both links share this process's
transport and signing code: only the link's own code differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.serving import REPO, _case_job, _ids, _worker_files, _workers


def _link_of(rev: str, folder: Path) -> ModuleType:
    path = folder / "scoring_link_before.py"
    path.write_text(subprocess.run(["git", "-C", str(REPO), "show",
                                    f"{rev}:fedboost/scoring_link.py"], check=True,
                                   capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location("scoring_link_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _turn(module: Any, run: Path, ids: list[str], seconds: float) -> dict[str, Any]:
    from fedboost.scoring_session import SessionPlan
    from fedboost.serving import _datasets, _job_of
    from flows.coordinator import broker_coordinator

    config = _job_of(run)
    plan = SessionPlan(job=f"{config.job[:40]}-ab-{uuid.uuid4().hex[:6]}",
                       model_job=config.job, protocol=config.protocol, active=config.active,
                       passives=list(config.passives), datasets=_datasets(config, []),
                       max_rows=64, timeout=60.0)
    coordinator = broker_coordinator(config, plan.job, plan.timeout)
    link = module.ScoringLink(plan, coordinator)
    link.open()
    link.start()
    asked: list[float] = []
    real = coordinator.presence

    def presence(parties: list[str]) -> dict[str, str]:
        asked.append(time.monotonic())
        return real(parties)  # type: ignore[misc]  # the coordinator's own method, kept

    coordinator.presence = presence
    try:
        started = time.monotonic()
        while not asked and time.monotonic() - started < 30:  # a new link is idle: it watches
            time.sleep(0.01)
        asked.clear()
        times: list[float] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            done = threading.Event()
            t0 = time.perf_counter()
            link.submit([ids[len(times)]], lambda outcome: done.set())
            done.wait(60)
            times.append(time.perf_counter() - t0)
    finally:
        link.stop()
        coordinator.transport.delete_inbox()  # type: ignore[attr-defined]  # a broker link's
        coordinator.transport.close()
    times.sort()
    return {"requests": len(times), "median_ms": round(times[len(times) // 2] * 1e3, 1),
            "watches": len(asked), "load": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--before", default="a873a89", help="git revision of the link before")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--url", default=os.environ.get(
        "FEDBOOST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
    args = parser.parse_args()
    os.environ["FEDBOOST_AMQP_URL"] = args.url
    import fedboost.scoring_link as now

    work = args.work.resolve()
    run = work / "runs" / "secureboost"
    job = _case_job("secureboost", args.url, work, 1024)
    if isinstance(job, str):  # why the case is skipped
        raise SystemExit(f"secureboost: {job}")
    files = _worker_files(work, args.url, 1024, [job["protocol"]])
    ids = _ids()
    with tempfile.TemporaryDirectory() as tmp, _workers(work, files, args.url):
        before = _link_of(args.before, Path(tmp))
        for turn in range(args.turns):
            for name, module in (("before", before), ("now", now)):
                offset = 1000 + 5000 * (2 * turn + (name == "now"))
                print(f"{name}: {_turn(module, run, ids[offset:], args.seconds)}", flush=True)


if __name__ == "__main__":
    main()
