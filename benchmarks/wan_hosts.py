"""The benchmark's hosts: ``deploy/netns-federation.sh`` under a prefix and /24 of its own, the
lender (guest) and the data provider (host) each in a namespace, and what ``benchmarks.wan``
does with them (their brokers' URLs, the data provider's link as a WAN profile)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from benchmarks.wan_links import RelayedLinks
from messages.broker_url import without_password
from benchmarks.wan_relay import Profile

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deploy" / "netns-federation.sh"


class Hosts:
    """``netns-federation.sh`` under this run's own prefix; the bridge's .1 this process's.

    ``per_org``: the lender (guest) and the data provider (host) each in its own namespace with
    its own broker, joined by shovels over TLS, the parties ``guest<tag>`` and ``host<tag>``;
    otherwise the guest's namespace with the one broker and the host's without."""

    def __init__(self, per_org: bool = False) -> None:
        self.prefix = f"fbw{uuid.uuid4().hex[:3]}"
        self.per_org = per_org
        self.tag = uuid.uuid4().hex[:6]  # the parties' names (per-org: fixed by the links)
        net = f"10.231.{int(self.prefix.encode().hex(), 16) % 254 + 1}"
        self.env = {**os.environ, "FEDBOOST_NETNS_PREFIX": self.prefix, "FEDBOOST_NETNS_NET": net,
                    "FEDBOOST_NETNS_DIR": f"/run/fedboost-netns-{self.prefix}"}
        self.hosts: dict[str, list[str]] = {}

    def script(self, *args: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], env=self.env, capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"netns-federation.sh {args[0]}: {done.stderr.strip()}")
        return done.stdout

    def __enter__(self) -> Hosts:
        try:
            if self.per_org:
                self.script("up", "--orgs", "guest,host", "--per-org", "--bridge-address",
                            "--parties", f"guest=guest{self.tag},host=host{self.tag}")
            else:
                self.script("up", "--orgs", "guest", "--machines", "host", "--bridge-address")
            for line in self.script("env").splitlines():
                name, _, namespace, address, *password = line.split()
                self.hosts[name] = [namespace, address, *password]
            if self.per_org:
                self.await_links()
        except BaseException:
            self.script("down")
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.script("down")

    def await_links(self, timeout: float = 60.0) -> None:
        """Every shovel of both brokers running."""
        deadline = time.monotonic() + timeout
        while True:
            states = [json.loads(line.split(" ", 1)[1]).get("state")
                      for line in self.script("links").splitlines() if " " in line]
            if states and all(state == "running" for state in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the brokers' links are not running: {states}")
            time.sleep(0.5)

    def reconnect(self) -> None:
        """Per-org: every connection of both brokers closed (the shovels dial again, through
        whatever is in their way now); returns once every shovel runs."""
        for org in ("guest", "host"):
            self.script("ctl", org, "close_all_connections", "fedboost benchmark: relinking")
        time.sleep(1.5)  # the shovels' reconnect delay is 1 s
        self.await_links()

    def purge(self, parties: list[str]) -> None:
        """Per-org: the parties' queues on both brokers emptied (the links define them)."""
        for org in ("guest", "host"):
            for party in parties:
                subprocess.run(["bash", str(SCRIPT), "ctl", org, "purge_queue",
                                f"fedboost.{party}"], env=self.env, capture_output=True,
                               timeout=60)

    def url(self, org: str) -> str:
        """``org``'s own broker, as its own user (per-org; otherwise the one broker)."""
        _, address, password = self.hosts[org if self.per_org else "guest"]
        user = org if self.per_org else "guest"
        return f"amqp://{user}:{password}@{address}:5672/%2F"

    def namespace(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[name][0]]

    @property
    def broker(self) -> str:
        return self.url("guest")

    @property
    def broker_in_job(self) -> str:
        """The lender's broker's URL for the job file, without the password (which reaches the
        flow and the workers as ``FEDBOOST_AMQP_URL``, so Prefect never stores it)."""
        return without_password(self.broker)

    def shape(self, profile: Profile) -> None:
        self.script("shape", "host", profile.rate or "off", profile.burst)

    def links(self, profile: Profile, records: Path) -> RelayedLinks:
        """Per-org: ``profile`` on the brokers' links, both ways (``benchmarks.wan_links``)."""
        return RelayedLinks(self.namespace("host"), self.hosts["guest"][1],
                            self.hosts["host"][1], profile,
                            lambda rate, burst: self.script("shape", "host", rate, burst),
                            self.reconnect, records)
