"""Signed envelopes: every message carries its sender's Ed25519 signature and a fresh nonce.

A sealed message is the msgpack map ``{v, signer, nonce, sent_at, envelope, signature}``, the
signature taken over the other fields (the envelope by its SHA-256). On receipt the signer's public key is looked up
(every flow endpoint signs as ``flow``; a party's helper processes sign as the party) and the
signature checked before the envelope is even parsed; then the envelope must name a sender the
signer speaks for. A nonce seen before is a replay, and so is a message older than
``Sealer.max_age`` (a receiver that restarted has forgotten its nonces, not the clock; a worker
also keeps the commands it answered on disk, see ``workers.answered``).
Keys live in one folder: ``<name>.key`` (PKCS#8, 0600, only on the owner's machine) and
``<name>.pub`` (SubjectPublicKeyInfo) for every identity of the federation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from messages import DecodeError, MessageError
from messages.codec import WireReader, decoding
from messages.e2e import decrypt_body, encrypt_body, own_key, pair_key
from messages.envelope import MAX_MESSAGE_BYTES, Envelope, decode_envelope, encode_envelope

SEAL_VERSION = 1
SEAL_VERSION_E2E = 2
"""A seal whose envelope is encrypted for its recipient (``messages.e2e``); it names the
recipient's identity (``to``) in what the signature covers."""
NONCE_BYTES = 16
SIGNATURE_BYTES = 64
FLOW_IDENTITY = "flow"
SEEN_NONCES = 100_000
"""Nonces remembered per receiver (a replay older than this is still caught by task ids)."""
MAX_AGE_SECONDS = 2 * 3600.0
"""Default age above which a message is refused: twice the flows' default step timeout (a flow
gives up on a step after ``transport.step_timeout``, so an older command is of no use to
anyone but a replayer). A worker sets its own (``max_message_age`` in its worker file)."""
CLOCK_SKEW_SECONDS = 300.0
"""How far ahead of the receiver's clock a sender's may be."""


@functools.lru_cache(maxsize=64)
def _signing_key(private: bytes) -> Ed25519PrivateKey:
    """The key object of a raw private key, made once per process (making one derives the
    public key: as long as the signature itself; a ``Sealer`` keeps raw bytes to stay
    picklable, so the objects are kept here)."""
    return Ed25519PrivateKey.from_private_bytes(private)


@functools.lru_cache(maxsize=1024)
def _verifying_key(public: bytes) -> Ed25519PublicKey:
    """The key object of a trusted raw public key, made once per process."""
    return Ed25519PublicKey.from_public_bytes(public)


class ForgedMessage(DecodeError):
    """A message whose signature does not verify, from an unknown signer, or replayed."""


def is_flow(name: str) -> bool:
    """Flow endpoints are ``flow`` (embedded) or ``flow.<job>.<id>`` (RabbitMQ); party names
    never contain a dot and are never ``flow``."""
    return name == FLOW_IDENTITY or name.startswith(FLOW_IDENTITY + ".")


def signer_of(sender: str) -> str:
    """The identity whose key signs a sender's messages."""
    return FLOW_IDENTITY if is_flow(sender) else sender


# ---- key files -----------------------------------------------------------------------------
def generate_key() -> bytes:
    """A new Ed25519 private key (its 32 raw bytes)."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def public_of(private: bytes) -> bytes:
    """The 32 raw bytes of a private key's public key."""
    return Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def write_key_pair(folder: Path, name: str) -> bool:
    """Write ``name.key`` (0600) and ``name.pub`` unless the key exists; True if written."""
    folder.mkdir(parents=True, exist_ok=True)
    private_path, public_path = folder / f"{name}.key", folder / f"{name}.pub"
    if private_path.exists():
        return False
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    # a link planted in the folder is refused, not written through (issue 28)
    fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return True


def load_private(path: Path) -> bytes:
    """The raw private key of a ``.key`` file."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise MessageError(f"signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise MessageError(f"signing key {path}: not an Ed25519 key")
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def load_public_keys(folder: Path) -> dict[str, bytes]:
    """Every ``<name>.pub`` of a key folder, as raw public keys."""
    keys = {}
    for path in sorted(folder.glob("*.pub")):
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise MessageError(f"public key {path}: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise MessageError(f"public key {path}: not an Ed25519 key")
        keys[path.stem] = key.public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw)
    return keys


# ---- sealing and opening -------------------------------------------------------------------
@dataclass(slots=True)
class Sealer:
    """One endpoint's signing key and the public keys it trusts (raw bytes: picklable, so a
    worker process can be handed its own)."""

    identity: str
    private: bytes
    trusted: dict[str, bytes]
    end_to_end: bool = False
    """Encrypt every envelope for its recipient (``messages.e2e``), and refuse envelopes that
    were not: for federations that do not trust the broker's operator."""
    max_age: float = MAX_AGE_SECONDS
    """Seconds after its signed send time that a message is still accepted."""
    _seen: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _pair_keys: dict[str, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def from_folder(cls, folder: Path, identity: str, *, end_to_end: bool = False) -> Sealer:
        """Load ``identity.key`` and every public key of a key folder."""
        private_path = folder / f"{identity}.key"
        if not private_path.is_file():
            raise MessageError(f"no signing key {private_path} (make one with "
                               f"'fedboost keys --out {folder} --name {identity}')")
        trusted = load_public_keys(folder)
        private = load_private(private_path)
        if trusted.get(identity) not in (None, public_of(private)):
            raise MessageError(f"{folder}/{identity}.pub does not match {private_path}")
        return cls(identity, private, trusted, end_to_end)

    def seal(self, env: Envelope) -> bytes:
        """Encode and sign an envelope."""
        if signer_of(env.sender) != self.identity:
            raise MessageError(f"{self.identity} cannot sign as {env.sender!r}")
        body = encode_envelope(env)
        nonce, sent_at = secrets.token_bytes(NONCE_BYTES), time.time()
        sealed: dict[str, object] = {"v": SEAL_VERSION, "signer": self.identity,
                                     "nonce": nonce, "sent_at": sent_at}
        to = None
        if self.end_to_end:
            to = signer_of(env.recipient)
            sealed.update(v=SEAL_VERSION_E2E, to=to)
            body = encrypt_body(self._pair_key(to), body,
                                _header(self.identity, nonce, sent_at, to))
        signature = _signing_key(self.private).sign(
            _signed_bytes(self.identity, nonce, sent_at, body, to))
        return msgpack.packb({**sealed, "envelope": body, "signature": signature},
                             use_bin_type=True)

    def _pair_key(self, peer: str) -> bytes:
        """The body key shared with ``peer`` (``messages.e2e.pair_key``), made once."""
        if peer not in self._pair_keys:
            public = self.trusted.get(peer)
            if public is None:
                raise MessageError(f"{self.identity}: no public key for {peer!r} to encrypt to")
            self._pair_keys[peer] = pair_key(self.private, self.identity, public, peer)
        return self._pair_keys[peer]

    def own_key(self, purpose: bytes) -> bytes:
        """A key for ``purpose`` that only holders of this identity's private key can derive
        (``messages.e2e.own_key``): what a party's processes seal to one another under."""
        return own_key(self.private, self.identity, purpose)

    def open(self, data: bytes) -> Envelope:
        """Parse, authenticate and de-duplicate a sealed message, or raise ``DecodeError``."""
        if len(data) > MAX_MESSAGE_BYTES + 256:
            raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
        raw = _read_seal(data)
        version, signer, nonce, sent_at = raw["v"], raw["signer"], raw["nonce"], raw["sent_at"]
        body, signature = raw["envelope"], raw["signature"]
        expected = SEAL_VERSION_E2E if "to" in raw else SEAL_VERSION
        if version != expected:
            raise DecodeError(f"seal version {version!r}, expected {expected}")
        if self.end_to_end and version != SEAL_VERSION_E2E:
            raise ForgedMessage(f"message signed by {signer!r} is not end-to-end encrypted "
                                f"(this party requires it: signing.end_to_end)")
        if len(nonce) != NONCE_BYTES or len(signature) != SIGNATURE_BYTES:
            raise DecodeError("sealed message: bad nonce or signature")
        public = self.trusted.get(signer)
        if public is None:
            raise ForgedMessage(f"message signed by {signer!r}: no public key for it")
        to = raw.get("to")
        try:
            _verifying_key(public).verify(
                signature, _signed_bytes(signer, nonce, sent_at, body, to))
        except InvalidSignature:
            raise ForgedMessage(f"message signed by {signer!r}: bad signature") from None
        if version == SEAL_VERSION_E2E:
            if raw["to"] != self.identity:
                raise ForgedMessage(f"message signed by {signer!r} is encrypted for "
                                    f"{raw['to']!r}, not {self.identity!r}")
            body = decrypt_body(self._pair_key(signer), body,
                                _header(signer, nonce, sent_at, to))
        env = decode_envelope(body)
        if signer_of(env.sender) != signer:
            raise ForgedMessage(f"{env.kind.name} from {env.sender!r} signed by {signer!r}")
        age = time.time() - sent_at
        if not -CLOCK_SKEW_SECONDS <= age <= self.max_age:
            raise ForgedMessage(f"{env.kind.name} from {env.sender!r}: sent {age:.0f} s ago "
                                f"(replayed, or clocks apart)")
        if nonce in self._seen:
            raise ForgedMessage(f"{env.kind.name} from {env.sender!r}: replayed message")
        self._seen[nonce] = None
        if len(self._seen) > SEEN_NONCES:
            self._seen.popitem(last=False)
        return env


_FIELDS = frozenset({"v", "signer", "nonce", "sent_at", "envelope", "signature"})
_FIELDS_E2E = _FIELDS | {"to"}
_NAME_BYTES = 64
_SEAL_READS: dict[str, Callable[[WireReader], Any]] = {
    "v": WireReader.read_int, "signer": lambda reader: reader.read_str(_NAME_BYTES),
    "nonce": WireReader.read_bytes, "sent_at": WireReader.read_float,
    "envelope": WireReader.read_bytes_view, "signature": WireReader.read_bytes,
    "to": lambda reader: reader.read_str(_NAME_BYTES)}


def _read_seal(data: bytes) -> dict[str, Any]:
    """A sealed message's fields, each of its type; the envelope as a view of ``data``, not a
    copy (decoding holds nothing but the message and what it decodes to: ``messages.codec``)."""
    reader = WireReader(data)
    raw: dict[str, Any] = {}
    with decoding("sealed message"):
        for _ in range(min(reader.read_map_header(), len(_FIELDS_E2E) + 1)):
            key = reader.read_str(_NAME_BYTES)
            read = _SEAL_READS.get(key)
            if read is None or key in raw:
                raise DecodeError(f"sealed message: field {key!r} unknown or repeated")
            raw[key] = read(reader)
    if set(raw) not in (_FIELDS, _FIELDS_E2E) or not reader.at_end():
        raise DecodeError(f"sealed message must be a map of {', '.join(sorted(_FIELDS))}")
    return raw


def _header(signer: str, nonce: bytes, sent_at: float, to: str | None = None) -> bytes:
    """The seal's fields but the envelope and signature (an encrypted seal's also name its
    recipient): signed, and bound to an encrypted body."""
    if to is None:
        return msgpack.packb([SEAL_VERSION, signer, nonce, sent_at], use_bin_type=True)
    return msgpack.packb([SEAL_VERSION_E2E, signer, nonce, sent_at, to], use_bin_type=True)


def _signed_bytes(signer: str, nonce: bytes, sent_at: float, body: bytes,
                  to: str | None = None) -> bytes:
    """What the signature covers: the seal's header and the envelope's SHA-256 (Ed25519 would
    hash a 15 MB shard twice to sign it; one SHA-256 pass is 4x cheaper)."""
    header = _header(signer, nonce, sent_at, to)
    return len(header).to_bytes(2, "big") + header + hashlib.sha256(body).digest()


def claimed_signer(data: bytes) -> str:
    """The signer a sealed message names, whether or not its signature holds ("" if none can
    be read from its first bytes): for counting refusals by sender, never for trusting."""
    unpacker = msgpack.Unpacker(raw=False, max_bin_len=64, max_str_len=64, max_array_len=0,
                                max_map_len=len(_FIELDS_E2E))
    unpacker.feed(data[:512])
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "signer":
                signer = unpacker.unpack()
                return signer if isinstance(signer, str) else ""
            unpacker.skip()
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types on garbage
        return ""
    return ""


def federation_sealers(names: list[str], *, end_to_end: bool = False) -> dict[str, Sealer]:
    """Fresh keys for a federation on one machine (the embedded default, tests): one sealer
    per party plus ``flow``, each trusting all of them."""
    private = {name: generate_key() for name in [*names, FLOW_IDENTITY]}
    trusted = {name: public_of(key) for name, key in private.items()}
    return {name: Sealer(name, key, dict(trusted), end_to_end) for name, key in private.items()}
