"""API keys of the scoring service: one per client, hashed at rest, revocable without a restart.

A key is ``fbk_<id>_<secret>``: ``id`` (8 hex digits) finds its record, ``secret`` is 32 random
bytes (base64url). The keys file holds, per key, the client's name, the id, the SHA-256 of the
whole key, when it was made and when it was revoked: never the key, which is shown once, when
it is made. A slow hash (scrypt, argon2) protects guessable passwords; a 256-bit random secret
cannot be guessed, so a plain SHA-256 of it is as safe at rest and costs microseconds per
request, not the tens of milliseconds a slow hash would add to every score. Presented keys are
compared by their digests in constant time (``hmac.compare_digest``).

The operator makes, lists and revokes keys with ``fedboost serve-model-keys``; the service
(``KeyRing``) looks at the file at most once a second and reloads it when it changed, so a
revoked key stops working within a second, without a restart.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import re
import secrets
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from boosting.tree import open_private

log = logging.getLogger("fedboost.serving")

KEYS_FORMAT = "fedboost-api-keys"
KEYS_VERSION = 1
KEY_PREFIX = "fbk_"
KEY_FORM = re.compile(r"fbk_([0-9a-f]{8})_[A-Za-z0-9_-]{43}")
CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
"""A client's name, as access log lines and metrics show it."""
SCOPES = ("score", "metrics")
"""What a key may ask: ``score`` is ``POST /v1/score``; ``metrics`` is the operator's view,
``/metrics``, ``/healthz`` and ``/readyz`` (they name the parties, the session and each
party's round times)."""
DEFAULT_SCOPES = ("score",)
"""A key made without ``--scope``, or before keys had scopes: scoring only."""
RELOAD_SECONDS = 1.0
"""How often the service looks at the keys file: a revoked key works at most this long."""


class KeysFileError(ValueError):
    """A keys file that cannot be read, or a change to it that is refused."""


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One client's key, as the keys file holds it."""

    name: str
    id: str
    sha256: str
    created: str
    revoked: str | None = None
    rate: float | None = None
    """Requests per second this client may send (None: the service's ``--rate``)."""
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    """What the key may ask (``SCOPES``)."""
    certificates: tuple[str, ...] = ()
    """The client certificate subjects (CN) the key may come with where the service asks for
    client certificates too ((): the key's own name only)."""

    def belongs_to(self, certificate: str) -> bool:
        """Whether a request with this key and a client certificate named ``certificate`` is
        one client (with mutual TLS and keys, both must name the same)."""
        return certificate in (self.certificates or (self.name,))


def digest(key: str) -> str:
    """The hex SHA-256 of a key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_keys(path: Path) -> list[KeyRecord]:
    """Every record of a keys file (a missing file has none)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise KeysFileError(f"{path}: not a keys file ({exc})") from None
    if not isinstance(raw, dict) or (raw.get("format"), raw.get("version")) != (
            KEYS_FORMAT, KEYS_VERSION):
        raise KeysFileError(f"{path}: not a {KEYS_FORMAT} v{KEYS_VERSION} file")
    try:
        records = [KeyRecord(**item) for item in raw["keys"]]
        records = [replace(r, scopes=tuple(r.scopes), certificates=tuple(r.certificates))
                   for r in records]
    except (KeyError, TypeError) as exc:
        raise KeysFileError(f"{path}: a malformed key record ({exc})") from None
    for record in records:
        if (not CLIENT_NAME.fullmatch(record.name) or not re.fullmatch(r"[0-9a-f]{8}", record.id)
                or not record.scopes or not set(record.scopes) <= set(SCOPES)
                or not all(isinstance(c, str) and c for c in record.certificates)):
            raise KeysFileError(f"{path}: a malformed key record ({record.name[:70]!r})")
    return records


def write_keys(path: Path, records: list[KeyRecord]) -> None:
    """Replace the keys file atomically, readable by its owner only."""
    body = {"format": KEYS_FORMAT, "version": KEYS_VERSION,
            "keys": [asdict(r) for r in records]}
    with open_private(path) as handle:
        handle.write(json.dumps(body, indent=1) + "\n")


def add_key(path: Path, name: str, rate: float | None = None,
            scopes: tuple[str, ...] = DEFAULT_SCOPES, certificates: tuple[str, ...] = ()) -> str:
    """Make a key for client ``name`` that may ask ``scopes``, with the client certificates
    named ``certificates`` (default: ``name``) where those are asked for too; the key is
    returned once and never stored."""
    if not CLIENT_NAME.fullmatch(name):
        raise KeysFileError(f"client name {name[:70]!r}: 1 to 64 letters, digits, '_', '.', "
                            f"'@' or '-', starting with a letter or digit")
    if rate is not None and not rate > 0:
        raise KeysFileError("--rate must be positive")
    if not scopes or not set(scopes) <= set(SCOPES):
        raise KeysFileError(f"--scope {', '.join(scopes) or '(none)'}: one or more of "
                            f"{', '.join(SCOPES)}")
    records = read_keys(path)
    if any(r.name == name and r.revoked is None for r in records):
        raise KeysFileError(f"{path}: client {name!r} has a key already (revoke it first)")
    taken = {r.id for r in records}
    key_id = secrets.token_hex(4)
    while key_id in taken:
        key_id = secrets.token_hex(4)
    key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    records.append(KeyRecord(name, key_id, digest(key), _now(), rate=rate,
                             scopes=tuple(dict.fromkeys(scopes)),
                             certificates=tuple(dict.fromkeys(certificates))))
    write_keys(path, records)
    return key


def revoke_key(path: Path, name: str) -> KeyRecord:
    """Revoke client ``name``'s key (the record stays, with the time it was revoked)."""
    records = read_keys(path)
    for k, record in enumerate(records):
        if record.name == name and record.revoked is None:
            records[k] = replace(record, revoked=_now())
            write_keys(path, records)
            return records[k]
    raise KeysFileError(f"{path}: client {name!r} has no key in use")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class KeyRing:
    """The service's keys: the file's keys in use, reloaded when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._by_id: dict[str, KeyRecord] = {}
        self._seen: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.reload()

    def reload(self) -> None:
        """Read the file now (the first read's errors stop the service)."""
        stat = self.path.stat()
        records = read_keys(self.path)
        self._by_id = {r.id: r for r in records if r.revoked is None}
        self._seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        self._checked = time.monotonic()

    @property
    def in_use(self) -> int:
        return len(self._by_id)

    def identify(self, presented: str) -> KeyRecord | None:
        """The record of a key in use, or None."""
        self._refresh()
        match = KEY_FORM.fullmatch(presented)
        record = self._by_id.get(match.group(1)) if match else None
        # compare even without a record: how long a refusal takes says nothing of the ids
        expected = record.sha256 if record is not None else "0" * 64
        same = hmac.compare_digest(digest(presented), expected)
        return record if same and record is not None else None

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_SECONDS:
            return
        self._checked = now
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size, stat.st_ino) == self._seen:
                return
            self.reload()
            log.info("keys file %s reloaded: %d keys in use", self.path, len(self._by_id))
        except (OSError, KeysFileError) as exc:
            # keep the keys of the last good read: a half-edited file neither locks every
            # client out nor lets anyone in
            log.error("keys file %s not reloaded (keeping %d keys in use): %s", self.path,
                      len(self._by_id), exc)


def add_command(sub: Any) -> None:
    """``fedboost serve-model-keys`` on the CLI's subcommands."""
    cmd = sub.add_parser("serve-model-keys", help="make, list and revoke the scoring service's "
                         "API keys (one per client; the file holds their hashes)")
    cmd.add_argument("--keys", type=Path, required=True, metavar="FILE",
                     help="the keys file 'fedboost serve-model --api-keys' reads")
    actions = cmd.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="make a key for a client and print it (once)")
    add.add_argument("name", help="the client's name (shown in access logs and metrics)")
    add.add_argument("--rate", type=float, help="requests per second this client may send "
                     "(default: serve-model --rate)")
    add.add_argument("--scope", action="append", choices=SCOPES, metavar="SCOPE",
                     help="what the key may ask (repeat): 'score' (POST /v1/score) or "
                          "'metrics' (/metrics, /healthz, /readyz); default: score")
    add.add_argument("--certificate", action="append", default=[], metavar="CN",
                     help="with serve-model --tls-client-ca: the client certificate subject "
                          "(CN) this key comes with (repeat; default: NAME); the key with "
                          "another client's certificate is refused")
    actions.add_parser("list", help="the clients, their key ids, and which keys are revoked")
    revoke = actions.add_parser("revoke", help="revoke a client's key (a running service "
                                "refuses it within a second)")
    revoke.add_argument("name")
    cmd.set_defaults(run=keys_command)


def keys_command(args: argparse.Namespace) -> int:
    """Run ``fedboost serve-model-keys``."""
    from flows.config import ConfigError

    try:
        if args.action == "add":
            key = add_key(args.keys, args.name, args.rate,
                          tuple(args.scope or DEFAULT_SCOPES), tuple(args.certificate))
            print(key)
            print(f"(client {args.name}: keep this key secret; it is not stored and cannot "
                  f"be shown again)", file=sys.stderr)
        elif args.action == "revoke":
            record = revoke_key(args.keys, args.name)
            print(f"revoked key {record.id} of client {record.name}")
        else:
            for r in read_keys(args.keys):
                state = f"revoked {r.revoked}" if r.revoked else "in use"
                rate = f", {r.rate:g} requests/s" if r.rate else ""
                certs = f"\tcertificates {','.join(r.certificates)}" if r.certificates else ""
                print(f"{r.name}\t{r.id}\tmade {r.created}\t{state}{rate}\t"
                      f"scopes {','.join(r.scopes)}{certs}")
    except KeysFileError as exc:
        raise ConfigError(str(exc)) from None
    return 0
