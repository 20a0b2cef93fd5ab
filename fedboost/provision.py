"""``fedboost provision``: one organisation's start kit for a federation of one broker per
organisation (``messages.broker_links``), made on its own machine in two steps.

``init`` makes what is the organisation's alone (its CA, its broker's and its shovels' TLS keys,
its parties' signing keys, its broker users' passwords, the passwords of the link users its
broker accepts from each other organisation) and an outbox per other organisation R,
``KIT/outbox/R/``, holding only what R may have: this organisation's CA certificate, its
identities' public signing keys and one secret, the password R's shovels log in to this
organisation's broker with. ``finish`` checks what the others sent and writes the broker's
definitions and TLS files, each party's worker file and the start commands. No private key
leaves the kit it was made in; every password file is 0600, every private folder 0700.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boosting.tree import open_private
from fedboost import broker, provision_compose, provision_text
from fedboost.provision_tls import TlsMaterialError, check_ca, make_ca, make_leaf
from flows.config import read_password_file
from flows.schema_base import ConfigError, read_yaml
from messages.broker_links import DescriptionError, Federation, broker_name
from messages.rabbit_queues import FLOWS_IN, FLOWS_OUT
from messages import MessageError
from messages.signing import load_public_keys, write_key_pair

OUTBOX_NOTE = "outbox.json"
LINK_PASSWORD = "link-password"
README = "README.md"


class ProvisionError(ConfigError):
    """Bad input to ``fedboost provision`` (one line saying what and where)."""


@dataclass(frozen=True)
class Description:
    """A federation description file: the federation, and a digest that every kit made from the
    same description shares (outboxes carry it, so a kit refuses one made from another)."""

    path: Path
    federation: Federation
    digest: str

    @classmethod
    def load(cls, path: Path) -> Description:
        raw = read_yaml(path)
        try:
            federation = Federation.from_description(raw)
        except DescriptionError as exc:
            raise ProvisionError(f"federation description {path}: {exc}") from None
        if not federation.name:
            raise ProvisionError(f"federation description {path}: no 'federation' name")
        federation.pin_peer_ca = True  # every organisation has a CA of its own
        digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()
        return cls(path, federation, digest)

    def check_org(self, org: str) -> None:
        if org not in self.federation.organisations:
            raise ProvisionError(f"--org {org!r}: not an organisation of {self.path} "
                                 f"({', '.join(self.federation.organisations)})")

    def others(self, org: str) -> list[str]:
        return [name for name in self.federation.organisations if name != org]


@dataclass(frozen=True)
class Kit:
    """Where each file of an organisation's kit lives."""

    root: Path

    @property
    def ca_key(self) -> Path:
        return self.root / "ca" / "ca.key"

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca" / "ca.pem"

    @property
    def tls(self) -> Path:
        """What the broker reads: its certificate, its shovels' client certificate, the CAs."""
        return self.root / "broker" / "tls"

    @property
    def passwords(self) -> Path:
        return self.root / "passwords"

    def key_dir(self, identity: str) -> Path:
        return self.root / "keys" / identity

    def outbox(self, to: str) -> Path:
        return self.root / "outbox" / to

    def local_password(self, identity: str) -> Path:
        """The password of ``identity``'s user on the organisation's own broker."""
        return self.passwords / broker.user_of(identity)

    def link_password(self, sender: str) -> Path:
        """The password of link user ``from-<sender>`` on the organisation's own broker."""
        return self.passwords / f"from-{sender}"


def init(description: Description, org: str, out: Path) -> list[str]:
    """Make ``org``'s private material and its outboxes in ``out``; lines saying what was
    made, what was kept (a re-run never replaces a key or a password) and what to send."""
    description.check_org(org)
    federation, kit = description.federation, Kit(out)
    for folder in (kit.root, kit.root / "ca", kit.root / "broker", kit.tls, kit.passwords,
                   kit.root / "keys", kit.root / "outbox"):
        _private_dir(folder)
    said = []
    subject = f"fedboost {federation.name} CA {org}"
    said.append(_made(make_ca(kit.ca_key, kit.ca_cert, subject), kit.ca_key, "CA key and ca.pem"))
    me = federation.organisations[org]
    made = make_leaf(kit.tls / "server.key", kit.tls / "server.pem", kit.ca_key, kit.ca_cert,
                     common_name=broker_name(org), names=(broker_name(org), me.address),
                     server=True)
    said.append(_made(made, kit.tls / "server.key", f"broker certificate {broker_name(org)}"))
    made = make_leaf(kit.tls / "link.key", kit.tls / "link.pem", kit.ca_key, kit.ca_cert,
                     common_name=f"link.{org}", server=False)
    said.append(_made(made, kit.tls / "link.key", "link client certificate"))
    for identity in federation.identities(org):
        _private_dir(kit.key_dir(identity))
        made = write_key_pair(kit.key_dir(identity), identity)
        said.append(_made(made, kit.key_dir(identity) / f"{identity}.key", "signing key"))
        said.append(_made(_new_password(kit.local_password(identity)),
                          kit.local_password(identity), "broker password"))
    for sender in description.others(org):
        said.append(_made(_new_password(kit.link_password(sender)), kit.link_password(sender),
                          f"password of link user from-{sender}"))
        _write_outbox(description, org, sender, kit)
        said.append(f"outbox for {sender}: {kit.outbox(sender)} (send it all to {sender}: "
                    f"{LINK_PASSWORD} is a secret for {sender} alone and goes over a "
                    f"confidential channel; the rest is public)")
    return said


def _write_outbox(description: Description, org: str, to: str, kit: Kit) -> None:
    """What organisation ``to`` receives from ``org``: public files and one password."""
    box = kit.outbox(to)
    _private_dir(box)  # it holds a password until it is sent
    for stale in box.iterdir():  # a re-run writes it afresh from the kit
        stale.unlink()
    _public(box / "ca.pem", kit.ca_cert.read_bytes())
    for identity in description.federation.identities(org):
        name = f"{identity}.pub"
        _public(box / name, (kit.key_dir(identity) / name).read_bytes())
    _private(box / LINK_PASSWORD, kit.link_password(to).read_text())
    note = {"federation": description.federation.name, "from": org, "to": to,
            "description_sha256": description.digest}
    _public(box / OUTBOX_NOTE, json.dumps(note, indent=1) + "\n")
    _public(box / README, provision_text.outbox_readme(org, to, LINK_PASSWORD))


@dataclass(frozen=True)
class Received:
    """What one other organisation sent, checked."""

    org: str
    ca: bytes
    public_keys: dict[str, bytes]
    """Its identities' ``.pub`` files (PEM), checked."""
    link_password: str
    """The password this organisation's shovels log in to ``org``'s broker with."""


def read_outbox(description: Description, me: str, sender: str, box: Path) -> Received:
    """``box`` as ``sender`` made it for ``me``: refused (one line) if anything is missing or
    not what it should be, or any file in it holds a private key."""
    where = f"--from {sender}={box}"
    if not box.is_dir():
        raise ProvisionError(f"{where}: not a folder")
    identities = description.federation.identities(sender)
    expected = {OUTBOX_NOTE, README, "ca.pem", LINK_PASSWORD, *(f"{i}.pub" for i in identities)}
    for path in sorted(box.iterdir()):
        if path.is_symlink():  # it could point into this kit: a password read as the link's
            raise ProvisionError(f"{where}: {path.name} is a symbolic link; an outbox holds "
                                 f"plain files only")
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            raise ProvisionError(f"{where}: {path.name} holds a private key; an outbox carries "
                                 f"none (ask {sender} to send its outbox again, and to make "
                                 f"new keys: this one has left its owner)")
        if path.name.endswith(".pub") and path.name not in expected:
            raise ProvisionError(f"{where}: {path.name}: {sender} has no party "
                                 f"{path.stem!r} in {description.path} (its parties: "
                                 f"{', '.join(identities)})")
        if path.name not in expected or not path.is_file():
            raise ProvisionError(f"{where}: unexpected {path.name} (an outbox holds "
                                 f"{', '.join(sorted(expected))})")
    missing = sorted(name for name in expected if not (box / name).is_file())
    if missing:
        raise ProvisionError(f"{where}: missing {', '.join(missing)}")
    try:
        note = json.loads((box / OUTBOX_NOTE).read_text())
    except ValueError as exc:
        raise ProvisionError(f"{where}: {OUTBOX_NOTE}: not JSON ({exc})") from None
    if (note.get("from"), note.get("to")) != (sender, me):
        raise ProvisionError(f"{where}: this outbox is from {note.get('from')!r} for "
                             f"{note.get('to')!r}, not from {sender!r} for {me!r}")
    if note.get("description_sha256") != description.digest:
        raise ProvisionError(f"{where}: made from another federation description than "
                             f"{description.path} (every organisation must use the same file)")
    try:
        ca = check_ca(box / "ca.pem")
    except TlsMaterialError as exc:
        raise ProvisionError(f"{where}: {exc}") from None
    try:  # every .pub is one of the sender's identities (above): each must be a signing key
        load_public_keys(box)
    except MessageError as exc:
        raise ProvisionError(f"{where}: {exc}") from None
    keys = {identity: (box / f"{identity}.pub").read_bytes() for identity in identities}
    password = next(iter((box / LINK_PASSWORD).read_text().splitlines()), "").strip()
    if not re.fullmatch(r"[A-Za-z0-9_-]{16,128}", password):
        raise ProvisionError(f"{where}: {LINK_PASSWORD}: expected one line of 16-128 letters, "
                             f"digits, '_' or '-' (as provision init writes it)")
    return Received(sender, ca, keys, password)


def finish(description: Description, org: str, kit_root: Path,
           sent: dict[str, Path]) -> list[str]:
    """Import every other organisation's outbox into ``org``'s kit and write its broker's
    definitions and TLS files, its worker files and its start commands."""
    description.check_org(org)
    kit, federation = Kit(kit_root), description.federation
    if not kit.ca_cert.is_file() or not kit.ca_key.is_file():
        raise ProvisionError(f"--kit {kit_root}: no CA of {org} there: run 'fedboost provision "
                             f"init {description.path} --org {org} --out {kit_root}' first")
    unknown = sorted(set(sent) - set(description.others(org)))
    if unknown:
        raise ProvisionError(f"--from {unknown[0]}: not another organisation of "
                             f"{description.path} ({', '.join(description.others(org))})")
    missing = [name for name in description.others(org) if name not in sent]
    if missing:
        raise ProvisionError(f"--from: missing the outbox of {', '.join(missing)} "
                             f"(--from ORG=DIR, one per other organisation)")
    received = [read_outbox(description, org, name, sent[name]) for name in
                description.others(org)]
    for identity in federation.identities(org):
        for path in (kit.key_dir(identity) / f"{identity}.key", kit.local_password(identity)):
            if not path.is_file():
                raise ProvisionError(f"--kit {kit_root}: {path} is missing: run provision "
                                     f"init again (it keeps what exists)")
    _import_trust(kit, received)
    _import_public_keys(kit, federation, org, received)
    for other in received:
        federation.link_passwords[(org, other.org)] = _read(kit.link_password(other.org))
        federation.link_passwords[(other.org, org)] = other.link_password
    _private(kit.root / "broker" / "definitions.json",
             json.dumps(broker_definitions(kit, federation, org), indent=1) + "\n")
    _public(kit.root / "broker" / "tls.conf", federation.tls_conf(org))
    _private_dir(kit.root / "workers")
    for party in federation.organisations[org].parties:
        _public(kit.root / "workers" / f"{party}.yaml",
                provision_text.worker_file(federation, org, party))
    if org == federation.lender:
        _private_dir(kit.root / "flows")
        _public(kit.root / "flows" / "transport.yaml",
                provision_text.flow_transport(federation, kit.root.resolve()))
    _write_compose(kit, federation, org)
    _public(kit.root / "START.md", provision_text.start_commands(federation, org, kit.root))
    return [f"imported the outboxes of {', '.join(r.org for r in received)}",
            f"wrote {kit.root / 'broker'}: definitions.json (0600: it holds the other brokers' "
            f"link passwords), tls.conf, tls/ (ca.pem: every organisation's CA; peers/)",
            f"wrote worker files in {kit.root / 'workers'}",
            f"the start commands: {kit.root / 'START.md'}",
            "the link-password files you received are now in broker/definitions.json: delete "
            "the copies"]


def _write_compose(kit: Kit, federation: Federation, org: str) -> None:
    """The organisation's compose file and its broker's configuration (``compose/``); at the
    lender also the Prefect server's passwords and a first job file (``jobs/job.yaml``, kept
    once written: it is the user's)."""
    folder = kit.root / "compose"
    folder.mkdir(exist_ok=True)
    _public(folder / "compose.yml", provision_compose.compose_file(federation, org))
    _public(folder / "rabbitmq.conf", provision_compose.rabbitmq_conf(federation, org))
    _public(folder / "enabled_plugins", "[rabbitmq_shovel].\n")
    (kit.root / "data").mkdir(exist_ok=True)  # FEDBOOST_DATA's default: the parties' data sets
    if org != federation.lender:
        return
    _new_password(kit.passwords / provision_compose.PREFECT_DB_PASSWORD)
    auth = kit.passwords / provision_compose.PREFECT_AUTH
    if not auth.exists():
        _private(auth, f"admin:{secrets.token_urlsafe(24)}\n", replace=False)
    (kit.root / "jobs").mkdir(exist_ok=True)
    job = kit.root / "jobs" / "job.yaml"
    if not job.exists():
        _public(job, provision_compose.job_file(federation))


def broker_definitions(kit: Kit, federation: Federation, org: str) -> dict[str, Any]:
    """``org``'s broker: its own users (``fedboost.broker``) and its links to the other
    brokers (``messages.broker_links``) in one definitions file."""
    lender = org == federation.lender
    passwords = {party: _read(kit.local_password(party))
                 for party in federation.organisations[org].parties}
    local = broker.definitions(passwords, _read(kit.local_password("flow")) if lender else None,
                               replies_via=None if lender else FLOWS_OUT,
                               replies_from=FLOWS_IN if lender else None)
    links = federation.definitions(org)
    merged = {key: list(local.get(key, [])) + list(links.get(key, [])) for key in links}
    merged["vhosts"] = links["vhosts"]
    # an inbox is declared in both, alike: once
    merged["queues"] = list({q["name"]: q for q in merged["queues"]}.values())
    return merged


def _import_trust(kit: Kit, received: list[Received]) -> None:
    """``ca.pem``: every organisation's CA (the TLS listener takes the others' link
    certificates); ``peers/R.pem``: R's CA alone (the shovel to R trusts nothing else)."""
    _private_dir(kit.tls / "peers")
    _public(kit.tls / "ca.pem", kit.ca_cert.read_bytes() + b"".join(r.ca for r in received))
    for other in received:
        _public(kit.tls / "peers" / f"{other.org}.pem", other.ca)


def _import_public_keys(kit: Kit, federation: Federation, org: str,
                        received: list[Received]) -> None:
    """Every identity's ``.pub`` in each of this organisation's key folders."""
    mine = {i: (kit.key_dir(i) / f"{i}.pub").read_bytes() for i in federation.identities(org)}
    everyone = dict(mine)
    for other in received:
        everyone.update(other.public_keys)
    for identity in mine:
        for name, pem in everyone.items():
            if name != identity:
                _public(kit.key_dir(identity) / f"{name}.pub", pem)


def _new_password(path: Path) -> bool:
    if path.exists():
        return False
    _private(path, secrets.token_urlsafe(24) + "\n", replace=False)
    return True


def _read(path: Path) -> str:
    return read_password_file(path, "password file")


def _made(made: bool, path: Path, what: str) -> str:
    return f"{'made' if made else 'kept existing'} {what}: {path}"


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise ProvisionError(f"{path}: not a folder")
    os.chmod(path, 0o700)


def _private(path: Path, content: str, *, replace: bool = True) -> None:
    with open_private(path, replace=replace) as f:
        f.write(content)


def _public(path: Path, content: str | bytes) -> None:
    with open_private(path, "wb", permissions=0o644) as f:
        f.write(content.encode() if isinstance(content, str) else content)
