"""Federations of real workers for tests: ``fedboost worker`` processes over the real broker.

``fedboost.local_workers.start_worker`` (which the benchmarks use too) starts one worker
process the way a party's operator does. ``CliFederation`` is a guest and a host of a shipped
job file under names of their own (so their queues are their own), with 1024-bit test keys,
workers that can be killed and started again, and every log kept;
``tests.scenarios.cli_workers`` starts workers from worker files. Tests that start workers use
these, so every test drives workers the same way.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from fedboost.local_workers import FEDBOOST, start_worker, stop_workers, worker_env
from messages.rabbit_queues import delete_party_queues
from messages.signing import write_key_pair

REPO = Path(__file__).resolve().parents[1]


class CliFederation:
    """A guest and a host as ``fedboost worker`` processes, restartable, with their logs kept.

    Jobs are ``job_file``'s (a shipped config) between this federation's own parties
    (``guest<tag>``, ``host<tag>``), 1024-bit, over the broker at ``url``, named
    ``<prefix>-<tag>-<name>``. The workers serve ``base.yaml`` (written at once) from
    ``root/models``.
    """

    def __init__(self, root: Path, url: str, *, prefix: str, job_file: str = "default_credit.yaml",
                 params: dict[str, Any] | None = None, step_timeout: float | None = 600,
                 protocols: list[str] | None = None, tag: str | None = None) -> None:
        self.root, self.url, self.tag = root, url, tag or uuid.uuid4().hex[:6]
        self.prefix, self.shipped, self.params = prefix, job_file, dict(params or {})
        self.step_timeout, self.protocols = step_timeout, protocols
        self.guest, self.host = f"guest{self.tag}", f"host{self.tag}"
        self.models = root / "models"
        self.env = worker_env()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        """Each party's latest worker process (a restart replaces it)."""
        self.started: list[subprocess.Popen[bytes]] = []
        """Every worker process started, helpers too."""
        self.logs: dict[str, list[Path]] = {self.guest: [], self.host: []}
        self.job_file = self.write_job("base")

    def write_job(self, name: str, *, crypto: dict[str, Any] | None = None,
                  **params: Any) -> Path:
        """The shipped job between this federation's parties, with ``params`` (over the
        federation's own) and ``crypto`` (e.g. ``{"scheme": "ou"}``), written to
        ``root/<name>.yaml``."""
        raw = yaml.safe_load((REPO / "configs" / self.shipped).read_text())
        guest, host = raw["parties"]["guest"], raw["parties"]["host"]
        for party in (guest, host):
            party["data"] = str((REPO / "configs" / party["data"]).resolve())
            # the workers' own policy allows test keys
            party["policy"] = {"min_key_bits": 1024, "min_ou_key_bits": 1024}
            if self.protocols is not None:
                party["policy"]["protocols"] = self.protocols
        raw["parties"] = {self.guest: guest, self.host: host}
        raw["job"] = f"{self.prefix}-{self.tag}-{name}"
        raw["params"].update({**self.params, **params})
        raw["crypto"].update({"key_bits": 1024, **(crypto or {})})
        raw["transport"] = {"kind": "rabbitmq", "url": self.url}
        if self.step_timeout is not None:
            raw["transport"]["step_timeout"] = self.step_timeout
        raw["signing"] = {"key_dir": str(self.root / "keys")}
        for identity in (self.guest, self.host, "flow"):
            write_key_pair(self.root / "keys", identity)
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path

    def start(self, party: str, *, processes: int = 1, args: Iterable[str] = (),
              log: Path | None = None, helper: bool = False,
              command: Iterable[str] = FEDBOOST,
              url: str | None = None) -> subprocess.Popen[bytes]:
        """A worker process of ``party`` serving ``base.yaml`` (``helper``: one more process
        of the party beside its worker, e.g. on another machine; it does not replace it),
        started by ``command`` (e.g. the CLI inside a network namespace), over the broker at
        ``url`` if given (its own organisation's, as ``FEDBOOST_AMQP_URL``: not on a command
        line) instead of the job's."""
        if log is None:
            kind = f"helper-{uuid.uuid4().hex[:4]}" if helper else str(len(self.logs[party]))
            log = self.root / f"{party}-{kind}.log"
        if not helper:
            self.logs[party].append(log)
        env = self.env if url is None else {**self.env, "FEDBOOST_AMQP_URL": url}
        proc = start_worker(party, self.job_file, log=log, cwd=self.root, env=env,
                            command=command, args=["--models", str(self.models), "--processes", str(processes),
                                  *args])
        self.started.append(proc)
        if not helper:
            self.procs[party] = proc
        return proc

    def log(self, party: str) -> str:
        """Everything ``party``'s workers (not helpers) logged, restarts included."""
        return "".join(path.read_text() for path in self.logs[party])

    def stop(self) -> list[int]:
        """Stop every worker still running; the exit codes of each party's latest one, in the
        order they were started."""
        codes = dict(zip(map(id, self.started), stop_workers(self.started)))
        return [codes[id(proc)] for proc in self.procs.values()]

    def exit_codes(self) -> list[int]:
        """Exit codes of every worker process started (after ``stop``)."""
        return [proc.wait(timeout=60) for proc in self.started]

    def delete_queues(self) -> None:
        delete_party_queues(self.url, [self.guest, self.host])
