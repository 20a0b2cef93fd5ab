"""Broker security: one RabbitMQ user per party and one for flows, each limited to its own
queues, written as a RabbitMQ definitions file (loaded by the compose file's broker, or by
``rabbitmqctl import_definitions``).

Nobody may create bindings or exchanges: every message goes through the default exchange
(permission ``amq.default``), so a party can address another party's inbox but never read it.

Passwords come from the environment or files, never from the command line by choice, and the
file holds only salted hashes. The shipped ``deploy/definitions.json`` has users without a
password (``password_hash`` empty: RabbitMQ refuses them every password login) until the
federation writes its own file with ``fedboost definitions``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import sys
from typing import Any

from flows.config import ConfigError, read_password_file
from messages.rabbit_queues import INBOX_ARGUMENTS, queue_of, work_queue_of

FLOW_USER = "fedboost-flow"
PUBLISH_ONLY = "^amq\\.default$"


def password_env(name: str) -> str:
    """The environment variable holding the broker password of a party (or of ``flow``):
    ``FEDBOOST_<NAME>_PASSWORD``, as docker-compose.yml uses them."""
    return f"FEDBOOST_{name.upper().replace('-', '_')}_PASSWORD"


def password_from(option: str, name: str, value: str | None) -> str:
    """A password for ``fedboost definitions``: from ``password_env(name)`` (no value), from
    the first line of a file (``@FILE``) or, with a warning, the value itself."""
    if value is None:
        password = os.environ.get(password_env(name), "")
        if not password:
            raise ConfigError(f"{option}: no password: set {password_env(name)} or give "
                              f"@FILE (a file holding it)")
        return password
    if value.startswith("@"):
        return read_password_file(value[1:], f"{option}: password file")
    print(f"fedboost: warning: {option}: a password on the command line shows in ps and shell "
          f"history; use {password_env(name)} or @FILE", file=sys.stderr)
    return value


def user_of(party: str) -> str:
    """The broker user of a party."""
    return f"fedboost-{party}"


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    salt = salt if salt is not None else secrets.token_bytes(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(stored_hash: str, password: str) -> bool:
    """True if ``password`` matches a ``password_hash`` value."""
    raw = base64.b64decode(stored_hash)
    return password_hash(password, raw[:4]) == stored_hash


def definitions(passwords: dict[str, str], flow_password: str | None, vhost: str = "/", *,
                replies_via: str | None = None,
                replies_from: str | None = None) -> dict[str, Any]:
    """Users, permissions and durable queues for the parties named in ``passwords`` (and the
    flows' user unless ``flow_password`` is None: a broker where no flow runs).

    Flow runs declare their own reply queues (``fedboost.flow.*``, expiring when unused). On a
    broker of one organisation among several (``messages.broker_links``) the parties also
    publish to ``replies_via`` (``fedboost.flows.out``: replies to flows at another broker) and
    the flows bind their reply queues to ``replies_from`` (``fedboost.flows.in``: replies
    shovelled in), which needs write on the queue and read on the exchange.
    """
    users, permissions, queues = [], [], []
    party_write = _exchanges("amq.default", replies_via)
    for party, password in sorted(passwords.items()):
        # its inbox, its work queue, and the private queues of its big work shards
        own = f"^({re.escape(queue_of(party))}|{re.escape(work_queue_of(party))}(\\..+)?)$"
        users.append(_user(user_of(party), password))
        permissions.append({"user": user_of(party), "vhost": vhost, "configure": own,
                            "write": party_write, "read": own})
        queues.append(_queue(queue_of(party), vhost, INBOX_ARGUMENTS))
        queues.append(_queue(work_queue_of(party), vhost, {}))
    if flow_password is not None:
        flow_queues = f"{re.escape(queue_of('flow.'))}.+"
        write, read = PUBLISH_ONLY, f"^{flow_queues}$"
        if replies_from is not None:
            write = f"^(amq\\.default|{flow_queues})$"
            read = f"^({flow_queues}|{re.escape(replies_from)})$"
        users.append(_user(FLOW_USER, flow_password))
        permissions.append({"user": FLOW_USER, "vhost": vhost, "configure": f"^{flow_queues}$",
                            "write": write, "read": read})
    return {"rabbit_version": "3.10.8", "users": users, "vhosts": [{"name": vhost}],
            "permissions": permissions, "queues": queues, "exchanges": [], "bindings": [],
            "parameters": [], "policies": []}


def _exchanges(*names: str | None) -> str:
    """A permission pattern matching exactly the exchanges ``names`` (None: left out)."""
    given = [re.escape(name) for name in names if name is not None]
    return f"^{given[0]}$" if len(given) == 1 else f"^({'|'.join(given)})$"


def _user(name: str, password: str) -> dict[str, Any]:
    return {"name": name, "password_hash": password_hash(password),
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}


def _queue(name: str, vhost: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "vhost": vhost, "durable": True, "auto_delete": False,
            "arguments": arguments}
