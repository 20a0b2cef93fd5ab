"""One broker per organisation: each broker's definitions from a federation description.

The protocols address parties by name only (``send("host", ...)`` publishes to queue
``fedboost.host`` on the default exchange, ``messages.rabbit_queues``), so crossing brokers is a
matter of the brokers' own topology, made here, and RabbitMQ's shovel plugin:

- On organisation O's broker, every party P of another organisation R has a **link queue** of
  P's inbox name (``fedboost.P``, durable): O's processes publish to it exactly as they would on a
  shared broker. A shovel ``fedboost-to-P`` running on O's broker moves it, over TLS, to R's
  broker, logged in as R's link user ``from-O``, into R's exchange ``fedboost.from.O`` with the
  message's own routing key (``fedboost.P``).
- On R's broker, ``fedboost.from.O`` (a topic exchange) is bound to the inboxes of R's own
  parties only (one binding per party, its queue's name as the key), and at the organisation
  that runs the flows (the lender) also to ``fedboost.flows.in`` for keys ``fedboost.flow.#``.
  The link user ``from-O`` may write to that exchange only, with those routing keys only (topic
  permissions), may configure and read nothing: O's shovel can put O's traffic into R's
  parties' inboxes (and the lender's flow replies), nothing else.
- Flow runs' reply queues (``fedboost.flow.<job>.<id>``) exist only at the lender's broker. A
  party elsewhere publishes a reply to its broker's fanout exchange ``fedboost.flows.out`` (the
  transport does so when the exchange exists), bound to the link queue ``fedboost.link.flows``,
  shovelled to the lender's ``fedboost.from.<R>``; the lender's flow binds its reply queue to
  ``fedboost.flows.in`` under its own name.
- Inboxes of an organisation's own parties are declared in its definitions, so a message that
  arrives before the party's worker started waits there (durable queues, persistent messages,
  confirms on both legs of each shovel: nothing queued is lost while a link or a broker is down).

Adding a party adds a link queue and a shovel at every other organisation and a binding at its
own; adding an organisation adds a link user and an exchange at every other one. No protocol
changes. What each organisation holds of another's broker: the password of the link user that
broker made for it (inside its own shovels' URIs), nothing else.

``python -m messages.broker_links FEDERATION.json OUT`` writes ``OUT/<org>/definitions.json``
(for ``rabbitmqctl import_definitions``; it holds the org's shovel URIs with its link passwords:
keep it root's) and ``OUT/<org>/tls.conf`` (the broker's TLS listener for incoming links). The
description::

    {"lender": "guest",
     "organisations": {"guest": {"address": "10.0.0.11", "parties": ["guest"]},
                       "host": {"address": "10.0.0.12", "parties": ["host"]}},
     "tls_port": 5671, "tls_dir": "/etc/fedboost/tls"}

``tls_dir``/``<org>/`` holds the organisation's TLS files (``deploy/make-certs.sh -o DIR -s
broker.<org> link``): ``ca.pem`` (the CA its broker and its shovels trust), ``server.pem/.key``
(its broker's certificate, name ``broker.<org>``) and ``link.pem/.key`` (the client certificate
its shovels present). ``fedboost provision`` (``fedboost.provision``) reads the same description
from YAML, with a ``federation`` name, and makes each organisation's kit on its own machine:
there each organisation has a CA of its own, so a shovel trusts only the CA of the broker it goes
to (``pin_peer_ca``: ``peers/<org>.pem``) and ``ca.pem`` is every organisation's CA (the TLS
listener's, for the other brokers' link certificates).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from messages.rabbit_queues import FLOWS_IN, FLOWS_OUT, INBOX_ARGUMENTS, QUEUE_PREFIX, queue_of

FROM_PREFIX = QUEUE_PREFIX + "from."
FLOWS_LINK = QUEUE_PREFIX + "link.flows"
FLOW_KEYS = queue_of("flow") + ".#"
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,19}$")
PARTY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ADDRESS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")  # a host name or IPv4: nothing a URI parses
KEYS = {"federation", "lender", "organisations", "tls_port", "tls_dir", "heartbeat", "amqp_port"}
ORGANISATION_KEYS = {"address", "parties"}


class DescriptionError(ValueError):
    """The federation description is unusable (one line saying why)."""


@dataclass(frozen=True)
class Organisation:
    name: str
    address: str
    parties: tuple[str, ...]


@dataclass
class Federation:
    lender: str
    organisations: dict[str, Organisation]
    tls_port: int = 5671
    tls_dir: str = "/etc/fedboost/tls"
    heartbeat: int = 5
    """Seconds between a shovel's heartbeats to the far broker: a pulled cable shows within
    about three of them."""
    link_passwords: dict[tuple[str, str], str] = field(default_factory=dict)
    """(receiver, sender) -> the receiver's link user's password for the sender."""
    name: str = ""
    """The federation's name (``federation:``), in its kits' certificates and file headers."""
    amqp_port: int = 5672
    """Where an organisation's own processes reach its broker (plain AMQP, inside it)."""
    pin_peer_ca: bool = False
    """Each shovel trusts only its destination's CA (``peers/<org>.pem``), not ``ca.pem``: for
    organisations with CAs of their own (``fedboost provision``), so one cannot pass for
    another's broker."""

    @classmethod
    def from_description(cls, description: dict[str, Any]) -> Federation:
        if not isinstance(description, dict):
            raise DescriptionError("expected a mapping (lender, organisations, ...)")
        _known_keys(description, KEYS, "")
        orgs = description.get("organisations")
        if not isinstance(orgs, dict) or len(orgs) < 2:
            raise DescriptionError("'organisations' must name at least two organisations")
        parsed: dict[str, Organisation] = {}
        owner: dict[str, str] = {}
        for name, spec in orgs.items():
            if not NAME.match(str(name)):
                raise DescriptionError(f"bad organisation name {name!r} (a-z, 0-9, _ or -)")
            if not isinstance(spec, dict):
                raise DescriptionError(f"organisation {name!r}: expected address and parties")
            _known_keys(spec, ORGANISATION_KEYS, f"organisation {name!r}: ")
            parties = spec.get("parties") or ()
            if not isinstance(parties, list | tuple):
                raise DescriptionError(f"organisation {name!r}: parties must be a list")
            parties = tuple(parties)
            if not parties:
                raise DescriptionError(f"organisation {name!r} names no parties")
            for party in parties:
                if not PARTY.match(str(party)) or party.startswith("flow"):
                    raise DescriptionError(f"bad party name {party!r} in {name!r}")
                if party in owner:
                    raise DescriptionError(f"party {party!r} is in {owner[party]!r} and {name!r}")
                owner[party] = name
            address = str(spec.get("address") or "")
            if not address:
                raise DescriptionError(f"organisation {name!r} has no broker address")
            if not ADDRESS.match(address):
                raise DescriptionError(f"organisation {name!r}: bad broker address {address!r} "
                                       f"(a host name or an IPv4 address)")
            parsed[name] = Organisation(name, address, parties)
        lender = description.get("lender")
        if lender not in parsed:
            raise DescriptionError(f"the lender {lender!r} is not one of the organisations")
        name = description.get("federation", "")
        if not isinstance(name, str) or (name and not NAME.match(name)):
            raise DescriptionError(f"bad federation name {name!r} (a-z, 0-9, _ or -)")
        return cls(lender=str(lender), organisations=parsed,
                   tls_port=_port(description, "tls_port", 5671),
                   tls_dir=str(description.get("tls_dir", "/etc/fedboost/tls")),
                   heartbeat=int(description.get("heartbeat", 5)), name=name,
                   amqp_port=_port(description, "amqp_port", 5672))

    def identities(self, org: str) -> tuple[str, ...]:
        """Who signs messages at ``org``: its parties and, at the lender, ``flow``."""
        parties = self.organisations[org].parties
        return (*parties, "flow") if org == self.lender else parties

    def link_password(self, receiver: str, sender: str) -> str:
        key = (receiver, sender)
        if key not in self.link_passwords:
            self.link_passwords[key] = secrets.token_urlsafe(24)
        return self.link_passwords[key]

    def definitions(self, org: str) -> dict[str, Any]:
        """Organisation ``org``'s broker: link users (one per other organisation) and their
        permissions, its parties' inboxes, link queues and shovels to the others."""
        me = self.organisations[org]
        others = [o for o in self.organisations.values() if o.name != org]
        queues = [_queue(queue_of(p), INBOX_ARGUMENTS) for p in me.parties]
        exchanges, bindings, users, permissions, topics, parameters = [], [], [], [], [], []
        allowed = [re.escape(queue_of(p)) for p in me.parties]
        if org == self.lender:
            exchanges.append(_exchange(FLOWS_IN, "direct"))
            allowed.append(re.escape(queue_of("flow")) + r"\..+")
        else:
            exchanges.append(_exchange(FLOWS_OUT, "fanout"))
            queues.append(_queue(FLOWS_LINK))
            bindings.append(_binding(FLOWS_OUT, FLOWS_LINK, "queue", ""))
            parameters.append(self._shovel(org, self.organisations[self.lender], "flows",
                                           FLOWS_LINK))
        for sender in others:
            exchange = FROM_PREFIX + sender.name
            user = "from-" + sender.name
            exchanges.append(_exchange(exchange, "topic"))
            for party in me.parties:
                bindings.append(_binding(exchange, queue_of(party), "queue", queue_of(party)))
            if org == self.lender:
                bindings.append(_binding(exchange, FLOWS_IN, "exchange", FLOW_KEYS))
            users.append({"name": user, "password_hash": password_hash(
                self.link_password(org, sender.name)),
                "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []})
            permissions.append({"user": user, "vhost": "/", "configure": "^$",
                                "write": f"^{re.escape(exchange)}$", "read": "^$"})
            topics.append({"user": user, "vhost": "/", "exchange": exchange,
                           "write": "^(" + "|".join(allowed) + ")$", "read": "^$"})
        for other in others:
            for party in other.parties:
                queues.append(_queue(queue_of(party)))
                parameters.append(self._shovel(org, other, party, queue_of(party)))
        return {"users": users, "vhosts": [{"name": "/"}], "permissions": permissions,
                "topic_permissions": topics, "queues": queues, "exchanges": exchanges,
                "bindings": bindings, "parameters": parameters, "policies": [],
                "global_parameters": []}

    def _shovel(self, org: str, to: Organisation, what: str, queue: str) -> dict[str, Any]:
        mine = f"{self.tls_dir}/{org}"
        trusted = f"{mine}/peers/{to.name}.pem" if self.pin_peer_ca else f"{mine}/ca.pem"
        query = urlencode({"cacertfile": trusted, "certfile": f"{mine}/link.pem",
                           "keyfile": f"{mine}/link.key", "verify": "verify_peer",
                           "server_name_indication": broker_name(to.name),
                           "heartbeat": self.heartbeat, "connection_timeout": 5000})
        password = quote(self.link_password(to.name, org), safe="")
        uri = f"amqps://from-{org}:{password}@{to.address}:{self.tls_port}/%2F?{query}"
        return {"vhost": "/", "component": "shovel", "name": f"fedboost-to-{what}",
                "value": {"src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": queue,
                          "src-prefetch-count": 256,
                          "dest-protocol": "amqp091", "dest-uri": uri,
                          "dest-exchange": FROM_PREFIX + org,
                          "ack-mode": "on-confirm", "reconnect-delay": 1}}

    def tls_conf(self, org: str, *, listen_on_all: bool = False) -> str:
        """The broker's listener for incoming links: TLS only, a client certificate required
        (on the organisation's address, or on every address of its own: a container's, whose
        address the engine gives it)."""
        me, mine = self.organisations[org], f"{self.tls_dir}/{org}"
        try:  # RabbitMQ listens on an IP address; a host name's broker on all of its own
            listener = f"{ipaddress.ip_address(me.address)}:{self.tls_port}"
        except ValueError:
            listener = str(self.tls_port)
        if listen_on_all:
            listener = str(self.tls_port)
        return "\n".join([
            f"listeners.ssl.1 = {listener}",
            f"ssl_options.cacertfile = {mine}/ca.pem",
            f"ssl_options.certfile = {mine}/server.pem",
            f"ssl_options.keyfile = {mine}/server.key",
            "ssl_options.verify = verify_peer",
            "ssl_options.fail_if_no_peer_cert = true", ""])


def _known_keys(spec: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(map(str, spec)) - known)
    if unknown:
        raise DescriptionError(f"{where}unknown key {unknown[0]!r} (known: "
                               f"{', '.join(sorted(known))})")


def _port(description: dict[str, Any], key: str, default: int) -> int:
    value = description.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise DescriptionError(f"{key}: expected a port number, not {value!r}")
    return value


def broker_name(org: str) -> str:
    """The name in organisation ``org``'s broker certificate (its shovels' peers check it)."""
    return f"broker.{org}"


def password_hash(password: str) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def _queue(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": dict(arguments or {})}


def _exchange(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "vhost": "/", "type": kind, "durable": True, "auto_delete": False,
            "internal": False, "arguments": {}}


def _binding(source: str, destination: str, kind: str, key: str) -> dict[str, Any]:
    return {"source": source, "vhost": "/", "destination": destination,
            "destination_type": kind, "routing_key": key, "arguments": {}}


def write(federation: Federation, out: Path) -> list[Path]:
    """Every organisation's ``definitions.json`` (0600: it holds link passwords) and
    ``tls.conf`` under ``out/<org>/``."""
    written = []
    for org in federation.organisations:
        folder = out / org
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "definitions.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(federation.definitions(org), f, indent=1)
        (folder / "tls.conf").write_text(federation.tls_conf(org))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m messages.broker_links FEDERATION.json OUT", file=sys.stderr)
        return 2
    try:
        federation = Federation.from_description(json.loads(Path(args[0]).read_text()))
    except (OSError, ValueError) as exc:
        print(f"broker_links: {args[0]}: {exc}", file=sys.stderr)
        return 1
    for path in write(federation, Path(args[1])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
