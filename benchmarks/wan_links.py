"""The links between two organisations' brokers (``netns-federation.sh up --per-org``) as a
WAN: every byte the brokers' shovels move between the organisations crosses the data
provider's rate-limited link and a delay relay (``benchmarks.wan_relay``), in both directions.

The shovels are RabbitMQ's and their addresses are the brokers' own, so the relays are put on
their path by address translation inside the data provider's namespace (``nft``, Debian's
``nftables``), not by configuration:

- its broker's shovels dialling out to the lender's broker (``rabbitmq``'s own connections to
  the lender's address, TLS port) are redirected to a relay that dials the lender's broker;
- the lender's shovels dialling in (to this namespace's address, TLS port) are redirected to a
  relay that dials its own broker.

TLS passes the relays untouched (each shovel checks the far broker's certificate by its name,
not its address). Connections open before the rules would bypass them, so every connection of
both brokers is closed once the relays listen: the shovels reconnect (1 s) through them. On the
way out the rules go and the shovels reconnect directly again.

Each relay records the reads it made; ``relayed`` merges them in the data provider's terms
(``up``: from the data provider, ``down``: to it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from benchmarks.wan_relay import Profile, start_relay

TLS_PORT = 5671
OUT_PORT, IN_PORT = 5674, 5675
TABLE = "fedboost_wan"


class RelayedLinks:
    """``profile`` on the links between the lender's broker and the data provider's.

    ``namespace``: the data provider's namespace prefix (``ip netns exec NS``); ``lender`` and
    ``provider``: the brokers' addresses; ``shape(rate, burst)`` limits the provider's link,
    ``reconnect()`` closes both brokers' connections and returns once every shovel runs."""

    def __init__(self, namespace: Sequence[str], lender: str, provider: str, profile: Profile,
                 shape: Callable[[str, str], object], reconnect: Callable[[], None],
                 records: Path) -> None:
        self.namespace, self.lender, self.provider = list(namespace), lender, provider
        self.profile, self._shape, self._reconnect = profile, shape, reconnect
        self.records = {"out": records / "relay-out.json", "in": records / "relay-in.json"}
        self._relays: list[subprocess.Popen[str]] = []

    def _nft(self, *args: str) -> None:
        done = subprocess.run([*self.namespace, "nft", *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nft {' '.join(args)}: {done.stderr.strip() or done.returncode} "
                               f"(the per-org topology needs nftables: apt-get install nftables)")

    def __enter__(self) -> RelayedLinks:
        self._shape(self.profile.rate or "off", self.profile.burst)
        try:
            self._relays.append(start_relay(self.namespace, ("0.0.0.0", OUT_PORT),
                                            (self.lender, TLS_PORT), self.profile.delay,
                                            self.records["out"]))
            self._relays.append(start_relay(self.namespace, ("0.0.0.0", IN_PORT),
                                            (self.provider, TLS_PORT), self.profile.delay,
                                            self.records["in"]))
            self._nft("add", "table", "ip", TABLE)
            self._nft("add", "chain", "ip", TABLE, "out",
                      "{ type nat hook output priority -100; }")
            self._nft("add", "chain", "ip", TABLE, "in",
                      "{ type nat hook prerouting priority -100; }")
            # only the broker's own dialling out: the relay's (root's) goes straight on
            self._nft("add", "rule", "ip", TABLE, "out", "meta", "skuid", "rabbitmq", "ip",
                      "daddr", self.lender, "tcp", "dport", str(TLS_PORT), "redirect", "to",
                      f":{OUT_PORT}")
            self._nft("add", "rule", "ip", TABLE, "in", "ip", "daddr", self.provider, "tcp",
                      "dport", str(TLS_PORT), "redirect", "to", f":{IN_PORT}")
            self._reconnect()
        except BaseException:
            self._undo()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._undo()

    def _undo(self) -> None:
        subprocess.run([*self.namespace, "nft", "delete", "table", "ip", TABLE],
                       capture_output=True)
        for relay in self._relays:  # SIGTERM: each writes its record
            relay.terminate()
        for relay in self._relays:
            relay.wait(timeout=60)
        self._relays.clear()
        self._shape("off", self.profile.burst)
        self._reconnect()

    def relayed(self) -> list[tuple[float, str, int]]:
        """Every read of both relays (wall clock, direction, bytes) in the data provider's
        terms: the out relay's ``up`` (from its dialler, the provider's broker) stays up, the in
        relay's (from the lender's broker) is down."""
        flip = {"up": "down", "down": "up"}
        reads = []
        for which, path in self.records.items():
            for at, direction, size in json.loads(path.read_text())["chunks"]:
                reads.append((at, direction if which == "out" else flip[direction], size))
        if not any(r for r in reads if r[1] == "down") or not any(r for r in reads
                                                                   if r[1] == "up"):
            raise RuntimeError("the shovels did not cross the relays both ways: the links "
                               "bypass the WAN")
        return sorted(reads)
