"""Organisations on hosts of their own for tests: ``deploy/netns-federation.sh`` as a fixture.

``netns_federation`` (session-scoped) brings up one Linux network namespace per organisation
(``guest`` and ``host``, each with its own RabbitMQ node on its own address) and one more for a
data provider's second machine (``host-2``, no broker), under a name prefix and state folder of
this session's own, so two sessions on one machine do not meet. It is torn down when the session
ends, also when a test failed or the run was interrupted (try/finally, and ``atexit`` for an exit
that skips the finally). Where namespaces cannot be made (not root, ``ip netns add`` refused,
no ``rabbitmq-server``) tests using it skip, and fail under ``CI=true``, as ``rabbit_url`` does.

Import the fixture into a test module: ``from tests.netns import netns_federation  # noqa: F401``.

WAN profiles (``PROFILES``: ``lan``, ``1gbit-5ms``, ``100mbit-50ms``, ``10mbit-50ms``, from
``benchmarks.wan_relay``): ``NetnsFederation.wan(name, profile, target)`` rate-limits ``name``'s
link (``tc tbf``) and starts the delay relay inside ``name``'s namespace in front of ``target``
(this kernel has no netem), for as long as the ``with`` block lasts.
``NetnsFederation(per_org=True, parties={"guest": [...], "host": [...]})`` is the
per-organisation topology (``up --per-org``: brokers joined by shovels over TLS,
``messages.broker_links``); ``links``/``await_links`` show its shovels, ``restart`` restarts an
organisation's broker, ``definitions`` and ``tls_dir`` give what it generated; with
``kits=DIR`` the brokers' files come from kits ``fedboost provision`` made instead.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from benchmarks.wan_relay import PROFILES, Profile, start_relay
from fedboost.local_workers import FEDBOOST

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "netns-federation.sh"
AMQP_PORT = 5672


class NetnsUnavailable(RuntimeError):
    """This machine (or user) cannot make network namespaces."""


@dataclass(frozen=True)
class NetnsHost:
    """One namespace: an organisation (``kind == "org"``, with a broker) or a further machine."""

    name: str
    kind: str
    namespace: str
    address: str
    password: str | None

    @property
    def broker_url(self) -> str:
        """The organisation's own broker, as its own user (an organisation's hosts only)."""
        if self.password is None:
            raise ValueError(f"{self.name} runs no broker (a machine, or up with --no-brokers)")
        return f"amqp://{self.name}:{self.password}@{self.address}:{AMQP_PORT}/%2F"

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this namespace."""
        return ["ip", "netns", "exec", self.namespace, *args]

    @property
    def fedboost(self) -> list[str]:
        """This interpreter's ``fedboost`` CLI inside the namespace (``start_worker``'s
        ``command``)."""
        return self.command(FEDBOOST)

    def python(self, code: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """This interpreter running ``code`` (with ``argv``) inside the namespace; its output
        as text."""
        return subprocess.run(self.command([sys.executable, "-c", code, *argv]),
                              capture_output=True, text=True, timeout=timeout)

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(args), **kwargs)


class NetnsFederation:
    """A running ``netns-federation.sh up`` under its own prefix; ``down`` removes all of it."""

    def __init__(self, *, orgs: Sequence[str] = ("guest", "host"),
                 machines: Sequence[str] = ("host-2",), brokers: bool = True,
                 bridge_address: bool = False, prefix: str | None = None,
                 per_org: bool = False, lender: str | None = None,
                 parties: dict[str, Sequence[str]] | None = None,
                 kits: Path | None = None) -> None:
        self.prefix = prefix or f"fb{uuid.uuid4().hex[:4]}"
        self.state = Path(f"/run/fedboost-netns-{self.prefix}")
        # a /24 of this federation's own (10.231.1-254.0), so two sessions' bridges never meet
        self.net = f"10.231.{int(self.prefix.encode().hex(), 16) % 254 + 1}"
        self.env = {**os.environ, "FEDBOOST_NETNS_PREFIX": self.prefix,
                    "FEDBOOST_NETNS_DIR": str(self.state), "FEDBOOST_NETNS_NET": self.net,
                    "FEDBOOST_PYTHON": sys.executable}
        self.hosts: dict[str, NetnsHost] = {}
        self._up_args = ["--orgs", ",".join(orgs)]
        if machines:
            self._up_args += ["--machines", ",".join(machines)]
        if not brokers:
            self._up_args.append("--no-brokers")
        if bridge_address:
            self._up_args.append("--bridge-address")
        self.per_org = per_org
        if per_org:
            self._up_args.append("--per-org")
            if lender:
                self._up_args += ["--lender", lender]
            if parties:
                self._up_args += ["--parties", ",".join(f"{org}={'+'.join(names)}"
                                                        for org, names in parties.items())]
            if kits:
                self._up_args += ["--kits", str(kits)]
        self._is_up = False

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def address(self, index: int) -> str:
        """The address ``up`` gives the ``index``-th namespace (1: the first of ``orgs``; the
        machines after them), known before it is up (a description for provisioning)."""
        return f"{self.net}.{10 + index}"

    def up(self) -> NetnsFederation:
        """Bring it up; ``NetnsUnavailable`` where namespaces cannot be made, ``RuntimeError``
        (after tearing down what was made) when anything else fails."""
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        for tool in ("ip", "tc", "rabbitmq-server", "rabbitmqctl"):
            if shutil.which(tool) is None:
                raise NetnsUnavailable(f"{tool} is not installed")
        self._is_up = True  # from here on a partial up is torn down too
        atexit.register(self.down)
        done = self.script("up", *self._up_args)
        if done.returncode != 0:
            self.down()
            if "cannot make network namespaces" in done.stderr:
                raise NetnsUnavailable(done.stderr.strip())
            raise RuntimeError(f"netns-federation.sh up failed:\n{done.stderr}")
        listed = self.script("env")
        if listed.returncode != 0:
            self.down()
            raise RuntimeError(f"netns-federation.sh env failed:\n{listed.stderr}")
        for line in listed.stdout.splitlines():
            name, kind, namespace, address, *password = line.split()
            self.hosts[name] = NetnsHost(name, kind, namespace, address,
                                         password[0] if password else None)
        return self

    def __getitem__(self, name: str) -> NetnsHost:
        return self.hosts[name]

    def shape(self, name: str, rate: str, burst: str | None = None) -> None:
        """A token-bucket rate (``"8mbit"``) on ``name``'s link, both ways; ``"off"`` lifts it;
        ``burst``: the bucket's depth (default 32kbit)."""
        self._ok(self.script("shape", name, rate, *([burst] if burst else [])))

    @contextmanager
    def wan(self, name: str, profile: str | Profile, target: tuple[str, int],
            listen_port: int = 5673, record: Path | None = None) -> Iterator[tuple[str, int]]:
        """``name``'s link as the WAN ``profile``: its rate on the link, and a delay relay in
        ``name``'s namespace to ``target`` (e.g. a broker's address and port); yields the
        address to connect to from ``name``'s namespace instead of ``target``. The relay
        writes its chunk record to ``record`` when the block ends; the link's limit is lifted."""
        link = PROFILES[profile] if isinstance(profile, str) else profile
        self.shape(name, link.rate or "off", link.burst)
        try:
            relay = start_relay(self[name].command([]), ("127.0.0.1", listen_port), target,
                                link.delay, record)
            try:
                yield "127.0.0.1", listen_port
            finally:
                relay.terminate()
                relay.wait(timeout=30)
        finally:
            self.shape(name, "off")

    def cut(self, name: str) -> None:
        """``name``'s link down: nothing reaches it or leaves it over the bridge."""
        self._ok(self.script("cut", name))

    def mend(self, name: str) -> None:
        self._ok(self.script("mend", name))

    def restart(self, org: str) -> None:
        """``org``'s broker node stopped and started again (its durable queues and messages,
        users and shovels come back from its own data folder)."""
        self._ok(self.script("restart", org))

    def rabbitmqctl(self, org: str, *args: str) -> str:
        """``rabbitmqctl ARGS`` against ``org``'s broker; its output."""
        return self._ok(self.script("ctl", org, *args))

    def status(self) -> str:
        return self._ok(self.script("status"))

    def links(self) -> dict[tuple[str, str], str]:
        """Per-organisation brokers: (organisation, shovel) -> its state (``running``, ...)."""
        states = {}
        for line in self._ok(self.script("links")).splitlines():
            org, status = line.split(" ", 1)
            shovel = json.loads(status)
            states[(org, shovel["name"])] = shovel["state"]
        return states

    def await_links(self, timeout: float = 60) -> None:
        """Every shovel of every broker running (they connect a moment after the brokers start,
        and again after a cut link is mended)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.links()
            if states and all(state == "running" for state in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"links not running after {timeout:.0f} s: {states}")
            time.sleep(0.5)

    def tls_dir(self, org: str) -> Path:
        """Organisation ``org``'s TLS files (per-org): ``ca.pem``, ``server.pem``/``.key`` of its
        broker, ``link.pem``/``.key`` its shovels present."""
        return self.state / "tls" / org

    def definitions(self, org: str) -> dict[str, Any]:
        """The definitions ``messages.broker_links`` wrote for ``org``'s broker (per-org)."""
        return json.loads((self.state / "links" / org / "definitions.json").read_text())

    def down(self) -> None:
        """Remove everything this federation made (namespaces, links, bridge, brokers); safe to
        call twice and after a partial ``up``."""
        if not self._is_up:
            return
        self._is_up = False
        atexit.unregister(self.down)
        done = self.script("down")
        if done.returncode != 0:
            raise RuntimeError(f"netns-federation.sh down failed:\n{done.stderr}")

    @staticmethod
    def _ok(done: subprocess.CompletedProcess[str]) -> str:
        if done.returncode != 0:
            raise RuntimeError(f"netns-federation.sh: {done.stderr.strip()}")
        return done.stdout


# One TCP stream between two namespaces: the sink receives until EOF on argv[1]:argv[2] (its
# socket deadline argv[3] s) and prints bytes and seconds from the first byte to EOF; the source
# connects to argv[1]:argv[2] (deadline argv[4] s) and sends argv[3] bytes.
STREAM_SINK = textwrap.dedent("""
    import json, socket, sys, time
    server = socket.create_server((sys.argv[1], int(sys.argv[2])))
    print("ready", flush=True)
    server.settimeout(float(sys.argv[3]))
    connection, _ = server.accept()
    connection.settimeout(float(sys.argv[3]))
    total, first = 0, None
    while chunk := connection.recv(1 << 16):
        first = first or time.monotonic()
        total += len(chunk)
    print(json.dumps({"bytes": total, "seconds": time.monotonic() - first}), flush=True)
""")

STREAM_SOURCE = textwrap.dedent("""
    import socket, sys
    with socket.create_connection((sys.argv[1], int(sys.argv[2])),
                                  timeout=float(sys.argv[4])) as connection:
        connection.sendall(b"x" * int(sys.argv[3]))
""")


def up_or_skip(federation: NetnsFederation) -> NetnsFederation:
    """``federation.up()``; where namespaces cannot be made, skip (fail under ``CI=true``)."""
    try:
        return federation.up()
    except NetnsUnavailable as exc:
        _unavailable(f"network namespaces cannot be made here: {exc}")


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def netns_federation() -> Iterator[NetnsFederation]:
    """Organisations ``guest`` and ``host`` with a broker each, and ``host-2`` (the host's
    second machine), each in its own namespace, the bridge's ``.1`` the test's own (where flows
    run); removed at the end of the session."""
    federation = up_or_skip(NetnsFederation(bridge_address=True))
    try:
        yield federation
    finally:
        federation.down()
