"""A worker stops at once when told to while it waits for an unreachable broker: SIGTERM (what
``docker stop`` sends) ends the reconnect wait instead of being held until the engine's SIGKILL
(60.6 s under compose's stop_grace_period, before: ``_connect`` slept through it). Real
``fedboost worker`` processes (two, as compose runs them), the real local RabbitMQ reached
through a TCP relay that the test cuts."""

from __future__ import annotations

import queue
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from tests.conftest import _free_port
from tests.scenarios import DATA
from tests.test_first_hour import FEDBOOST, _env

STOPPED_WITHIN = 10.0
"""Seconds from SIGTERM to exit that pass (a fraction of a second on a quiet machine; the
reconnect wait it replaces lasts reconnect_seconds, 300 s)."""


class _Relay:
    """127.0.0.1:port -> the broker, until ``cut``: then the port refuses connections and every
    relayed connection is gone, as when the broker's host goes away."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.gone = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                if self.gone:
                    client.close()
                    return
                upstream = socket.create_connection(self.target)
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            self.gone = True
            try:  # wakes the accepting thread (a close alone would leave it listening)
                self.listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.listener.close()
            for s in self.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


def _worker(tmp_path: Path, party: str, port: int, user: str) -> subprocess.Popen[str]:
    subprocess.run([*FEDBOOST, "keys", "--out", str(tmp_path / "keys"), "--name", party],
                   check=True, capture_output=True, env=_env(), timeout=120)
    config = tmp_path / f"{party}.yaml"
    config.write_text(yaml.safe_dump({
        "party": party, "data": str(DATA / "breast_hetero_host.csv"), "processes": 2,
        "transport": {"kind": "rabbitmq", "url": f"amqp://{user}@127.0.0.1:{port}/%2F",
                      "password_file": "broker.pw"},
        "signing": {"key_dir": str(tmp_path / "keys")}}))
    return subprocess.Popen([*FEDBOOST, "worker", "--party", party, "--config", str(config)],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def _processes_saying(seen: list[str], text: str) -> set[str]:
    """The worker processes (pids, from each line's "[party pid]") with a line holding text."""
    return {m.group(1) for line in seen if text in line
            and (m := re.search(r"\[\S+ (\d+)\]", line))}


def _wait_for(lines: queue.Queue[str | None], seen: list[str], text: str, count: int,
              seconds: float) -> None:
    """Until ``count`` worker processes said ``text``."""
    deadline = time.monotonic() + seconds
    while len(_processes_saying(seen, text)) < count:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            raise AssertionError(f"no {count} line(s) {text!r} in {seconds:.0f} s:\n"
                                 + "\n".join(seen))
        seen.append(line)


def _stop(proc: subprocess.Popen[str], lines: queue.Queue[str | None],
          seen: list[str]) -> float:
    """SIGTERM; the seconds until the worker exited (its remaining lines into ``seen``)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("the worker was still waiting for the broker 60 s after SIGTERM:\n"
                             + "\n".join(seen)) from None
    took = time.monotonic() - sent
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    return took


def _assert_stopped(proc: subprocess.Popen[str], seen: list[str], took: float, party: str,
                    port: int) -> None:
    out = "\n".join(seen)
    assert took < STOPPED_WITHIN, f"{took:.1f} s after SIGTERM\n{out}"
    assert proc.returncode == 0 and "Traceback" not in out, out
    # each of its two processes says why it stopped, naming where it could not reach
    assert len(_processes_saying(seen, f"{party}: stopped while waiting for the broker at "
                                       f"127.0.0.1:{port} (connection refused)")) == 2, out


def test_sigterm_ends_the_wait_for_a_broker_that_never_answered(tmp_path: Path) -> None:
    party, port = f"stop{time.time_ns() % 10**8}", _free_port()  # nothing listens there
    (tmp_path / "broker.pw").write_text("unused\n")
    (tmp_path / "broker.pw").chmod(0o600)
    proc = _worker(tmp_path, party, port, "fedboost")
    try:
        lines, seen = _lines(proc), []
        # both processes tried at least once: they wait for the broker now
        _wait_for(lines, seen, "cannot reach the broker", 2, 120)
        took = _stop(proc, lines, seen)
    finally:
        proc.kill()
    _assert_stopped(proc, seen, took, party, port)


def test_sigterm_ends_the_reconnect_wait_of_a_serving_worker(tmp_path: Path,
                                                              rabbit_url: str) -> None:
    broker = urlsplit(rabbit_url)
    relay = _Relay((broker.hostname or "127.0.0.1", broker.port or 5672))
    party = f"stop{time.time_ns() % 10**8}"  # its own queues on the shared broker
    (tmp_path / "broker.pw").write_text(f"{broker.password}\n")
    (tmp_path / "broker.pw").chmod(0o600)
    proc = _worker(tmp_path, party, relay.port, broker.username or "guest")
    try:
        lines, seen = _lines(proc), []
        _wait_for(lines, seen, f"worker {party} serving", 2, 120)  # both processes
        relay.cut()  # the broker goes away under the serving worker
        _wait_for(lines, seen, "cannot reach the broker", 2, 60)
        took = _stop(proc, lines, seen)
    finally:
        proc.kill()
        relay.cut()
    _assert_stopped(proc, seen, took, party, relay.port)
