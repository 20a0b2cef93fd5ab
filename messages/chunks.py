"""Chunk frames of large messages: the frames a message is cut into, the signed manifest every
frame carries, and reassembly that no broker user can jam.

A message above ``chunk_bytes`` travels as ``count`` frames under one message id, each naming
its index, the count and the whole payload's SHA-256. Every frame also carries the same signed
manifest ``[v, message id, SHA-256, count, size, recipient, sender, sent_at]``: Ed25519 under
the key that signs the sender's envelopes (parties as themselves, flows as ``flow``), so the
same identities and trust apply. The receiver checks it before holding a frame: a frame nobody
in the federation signed, or signed for another recipient, is dropped and acknowledged at once.

Held frames wait unacknowledged until their message is whole and handled (so a lost connection
redelivers them). What one signer may hold is capped: ``max_partials`` messages, together at
most the frames of one largest message (reserved by their signed counts when the first frame
arrives) and ``max_bytes``; a partial without a new frame for ``partial_seconds`` is dropped.
``window`` sizes the prefetch so that every signer's frames, one whole message being handled and
a few ordinary messages fit together: partials can never fill it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pika
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from messages import DecodeError, MessageError
from messages.rejections import RejectionLog
from messages.signing import CLOCK_SKEW_SECONDS, Sealer, signer_of

log = logging.getLogger("fedboost.transport")

FRAME_VERSION = 1
_CONTEXT = b"fedboost chunk manifest\x00"
"""Prefixes the signed bytes: a manifest signature is never a valid envelope signature."""
DEFAULT_PARTIAL_SECONDS = 120.0
"""A partial message without a new chunk for this long is dropped (its sender died, or never
meant to finish); chunks of one message follow each other within seconds."""
DEFAULT_MAX_PARTIALS = 8
"""Messages one signer may have in progress at once (a party's processes send concurrently)."""
ORDINARY_ROOM = 8
"""Prefetch room for whole messages beyond every signer's reservation and the one in hand."""
_REFUSED_IDS = 10_000

Tag = tuple[int, int]
"""A delivery: (connection generation, delivery tag)."""


def chunk_messages(queue: str, data: bytes, step: int, digest: str | None = None, *,
                   persistent: bool = True) -> list[tuple[str, bytes, Any]]:
    """``data`` as messages to ``queue`` of at most ``step`` bytes, under one message id; when
    there are several (or a ``digest`` is given) each names its index, their count and the whole
    payload's SHA-256. Persistent ones survive a broker restart; transient ones are never
    written to its disk."""
    message_id = uuid.uuid4().hex
    count = max(1, math.ceil(len(data) / step))
    if count > 1 and digest is None:
        digest = hashlib.sha256(data).hexdigest()
    mode = pika.DeliveryMode.Persistent if persistent else pika.DeliveryMode.Transient
    return [(queue, data[k * step:(k + 1) * step], pika.BasicProperties(
        delivery_mode=mode, message_id=message_id,
        headers=None if digest is None else {"fb-index": k, "fb-count": count,
                                             "fb-sha256": digest}))
        for k in range(count)]


class ForgedFrame(DecodeError):
    """A chunk frame without a valid manifest signed by a trusted identity for this receiver."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the sender of a chunked message signs once for all of its frames."""

    message_id: str
    sha256: str
    count: int
    size: int
    recipient: str
    sender: str
    sent_at: float

    def pack(self) -> bytes:
        return msgpack.packb([FRAME_VERSION, self.message_id, self.sha256, self.count, self.size,
                              self.recipient, self.sender, self.sent_at], use_bin_type=True)

    @classmethod
    def unpack(cls, data: bytes) -> Manifest:
        try:
            raw = msgpack.unpackb(data, raw=False, max_bin_len=0, max_str_len=300,
                                  max_array_len=8, max_map_len=0)
        except Exception as exc:  # msgpack raises several unrelated types on garbage
            raise DecodeError(f"chunk manifest: {exc}") from exc
        if not isinstance(raw, list) or len(raw) != 8:
            raise DecodeError("chunk manifest: not a list of 8 fields")
        version, message_id, digest, count, size, recipient, sender, sent_at = raw
        if not (type(version) is int and version == FRAME_VERSION and type(count) is int
                and type(size) is int and type(sent_at) is float
                and all(isinstance(s, str) for s in (message_id, digest, recipient, sender))):
            raise DecodeError("chunk manifest: bad version or field types")
        return cls(message_id, digest, count, size, recipient, sender, sent_at)


def claimed_sender(headers: dict[str, Any]) -> str:
    """The sender a frame's manifest names, verified or not (for warnings)."""
    name = _claimed_name(headers)
    return repr(name) if name else "nobody (no readable manifest)"


def _claimed_name(headers: dict[str, Any]) -> str:
    try:
        return Manifest.unpack(headers["fb-manifest"]).sender
    except (KeyError, TypeError, DecodeError):
        return ""


class FrameSigner:
    """Signs the manifests of an endpoint's chunked messages and verifies those it receives,
    with the key and the trusted public keys of its envelope ``Sealer``."""

    def __init__(self, sealer: Sealer) -> None:
        self.identity = sealer.identity
        self.max_age = sealer.max_age
        """The same age limit as the endpoint's envelopes (a worker's ``max_message_age``)."""
        self._key = Ed25519PrivateKey.from_private_bytes(sealer.private)
        self._trusted = {name: Ed25519PublicKey.from_public_bytes(public)
                         for name, public in sealer.trusted.items()}

    @property
    def signers(self) -> int:
        """How many identities may send chunked messages (each gets its own reservation)."""
        return len(self._trusted)

    def headers(self, manifest: Manifest) -> dict[str, bytes]:
        """The frame headers carrying ``manifest`` and its signature."""
        if signer_of(manifest.sender) != self.identity:
            raise MessageError(f"{self.identity} cannot sign chunks as {manifest.sender!r}")
        packed = manifest.pack()
        return {"fb-manifest": packed, "fb-signature": self._key.sign(_CONTEXT + packed)}

    def verify(self, headers: dict[str, Any], recipient: str) -> Manifest:
        """The frame's manifest if a trusted identity signed it for ``recipient`` lately; else
        ``ForgedFrame`` naming the claimed sender."""
        packed, signature = headers.get("fb-manifest"), headers.get("fb-signature")
        if not isinstance(packed, bytes) or not isinstance(signature, bytes):
            raise ForgedFrame(f"unsigned chunk frame claiming sender {claimed_sender(headers)}")
        try:
            manifest = Manifest.unpack(packed)
        except DecodeError as exc:
            raise ForgedFrame(f"chunk frame with an unreadable manifest: {exc}") from None
        sender, signer = manifest.sender, signer_of(manifest.sender)
        public = self._trusted.get(signer)
        if public is None:
            raise ForgedFrame(f"chunk frame claiming sender {sender!r}: no public key for "
                              f"{signer!r}")
        try:
            public.verify(signature, _CONTEXT + packed)
        except InvalidSignature:
            raise ForgedFrame(f"chunk frame claiming sender {sender!r}: bad signature") from None
        if manifest.recipient != recipient:
            raise ForgedFrame(f"chunk frame from {sender!r} for {manifest.recipient!r}, "
                              f"not {recipient!r}")
        age = time.time() - manifest.sent_at
        if not -CLOCK_SKEW_SECONDS <= age <= self.max_age:
            raise ForgedFrame(f"chunk frame from {sender!r} sent {age:.0f} s ago (replayed, or "
                              f"clocks apart)")
        return manifest


@dataclass(slots=True)
class _Partial:
    """Frames of one message received so far."""

    signer: str
    """Whose reservation it counts against ("" when frames are not signed)."""
    count: int
    digest: str
    size: int
    """Declared (signed) size, or 0 when unknown."""
    proof: bytes
    """The manifest and signature: a later frame carrying the same is not verified again."""
    chunks: dict[int, bytes] = field(default_factory=dict)
    tags: list[Tag] = field(default_factory=list)
    held: int = 0
    last: float = field(default_factory=time.monotonic)


class Reassembly:
    """The partial messages of one receiving endpoint, with their caps and expiry.

    ``drop`` acknowledges frames that will never be handed over (the broker forgets them);
    ``rejections`` logs the frames it drops within budgets (``messages.rejections``).
    """

    def __init__(self, owner: str, frames: FrameSigner | None, *, max_frames: int, max_bytes: int,
                 partial_seconds: float, max_partials: int,
                 drop: Callable[[list[Tag]], None],
                 rejections: RejectionLog | None = None) -> None:
        self.owner = owner
        self.rejections = rejections or RejectionLog(log, owner)
        self.frames = frames
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.partial_seconds = partial_seconds
        self.max_partials = max_partials
        self._drop = drop
        self._partials: dict[str, _Partial] = {}
        self._refused: OrderedDict[str, None] = OrderedDict()
        self._paused_at: float | None = None

    def window(self) -> int:
        """A prefetch count that holds every signer's reserved frames, one whole message being
        handled and some ordinary ones."""
        signers = self.frames.signers if self.frames is not None else 1
        return (signers + 1) * self.max_frames + ORDINARY_ROOM

    def pause(self) -> None:
        """The endpoint stops receiving (its caller handles a message): frames that arrive
        meanwhile wait unread, so partials do not age until ``resume``."""
        self._paused_at = time.monotonic()

    def resume(self) -> None:
        if self._paused_at is not None:
            idle, self._paused_at = time.monotonic() - self._paused_at, None
            for partial in self._partials.values():
                partial.last += idle

    def clear(self) -> None:
        """The connection was lost: its unacknowledged frames come back from the broker."""
        self._partials.clear()

    def file(self, tag: Tag, headers: dict[str, Any], message_id: str,
             body: bytes) -> tuple[bytes, list[Tag]] | None:
        """Hold a chunk frame; the whole payload and its frames once the last one arrived."""
        count, index = headers.get("fb-count"), headers.get("fb-index")
        digest = headers.get("fb-sha256")
        if (type(count) is not int or type(index) is not int or not 0 <= index < count
                or count > self.max_frames or not isinstance(digest, str | bytes)
                or not message_id):
            self._reject("malformed chunk", _claimed_name(headers), "dropped a malformed chunk "
                         "frame claiming sender %s", claimed_sender(headers))
            self._drop([tag])
            return None
        digest = digest.decode(errors="replace") if isinstance(digest, bytes) else digest
        if message_id in self._refused:
            self._reject("chunk of a refused message", _claimed_name(headers), "dropped a "
                         "further chunk of refused message %s", message_id, level=logging.INFO)
            self._drop([tag])
            return None
        partial, proof = self._partials.get(message_id), _proof(headers)
        if partial is None:
            signer, size = self._verify(headers, message_id, count, digest)
            partial = None if signer is None else self._open(message_id, signer, count, digest,
                                                             size, proof)
            if partial is None:
                self._drop([tag])
                return None
        if (partial.proof != proof or partial.count != count or partial.digest != digest
                or index in partial.chunks):
            self._reject("inconsistent chunk", _claimed_name(headers), "dropped a duplicate or "
                         "inconsistent chunk of %s", message_id)
            self._drop([tag])
            return None
        return self._add(message_id, partial, index, tag, body)

    def _verify(self, headers: dict[str, Any], message_id: str, count: int,
                digest: str) -> tuple[str | None, int]:
        """The signer and declared size of a frame (``("", 0)`` when frames are not signed);
        ``(None, 0)``, with a warning, for a frame that does not verify."""
        if self.frames is None:
            return "", 0
        try:
            manifest = self.frames.verify(headers, self.owner)
        except ForgedFrame as exc:
            self._reject("forged chunk", _claimed_name(headers), "dropped a %s", exc)
            return None, 0
        if (manifest.message_id != message_id or manifest.count != count
                or manifest.sha256 != digest or not 0 < manifest.size <= self.max_bytes):
            self._reject("chunk unlike its manifest", manifest.sender, "dropped a chunk frame "
                         "from %r that does not match its manifest", manifest.sender,
                         authenticated=True)
            return None, 0
        return signer_of(manifest.sender), manifest.size

    def _open(self, message_id: str, signer: str, count: int, digest: str, size: int,
              proof: bytes) -> _Partial | None:
        """A new partial, unless its signer's reservation is used up."""
        own = [p for p in self._partials.values() if p.signer == signer]
        frames, size_held = sum(p.count for p in own), sum(p.size or p.held for p in own)
        if (len(own) >= self.max_partials or frames + count > self.max_frames
                or size_held + size > self.max_bytes):
            self._reject("chunks over their cap", signer, "dropped message %s from %s: over its "
                         "cap of %d messages, %d chunks and %d bytes in progress", message_id,
                         repr(signer) if signer else "unsigned senders", self.max_partials,
                         self.max_frames, self.max_bytes, authenticated=bool(signer))
            self._refuse(message_id)
            return None
        partial = self._partials[message_id] = _Partial(signer, count, digest, size, proof)
        return partial

    def _add(self, message_id: str, partial: _Partial, index: int, tag: Tag,
             body: bytes) -> tuple[bytes, list[Tag]] | None:
        partial.chunks[index], partial.last = body, time.monotonic()
        partial.held += len(body)
        partial.tags.append(tag)
        held = sum(p.held for p in self._partials.values() if p.signer == partial.signer)
        if partial.held > (partial.size or self.max_bytes) or held > self.max_bytes:
            self._reject("chunks over their size", partial.signer, "dropped message %s: its "
                         "chunks exceed its size or its sender's %d-byte cap", message_id,
                         self.max_bytes)
            self._discard(message_id)
            return None
        if len(partial.chunks) < partial.count:
            return None
        del self._partials[message_id]
        data = b"".join(partial.chunks[i] for i in range(partial.count))
        if hashlib.sha256(data).hexdigest() != partial.digest:
            self._reject("chunks fail their SHA-256", partial.signer, "dropped %s: reassembled "
                         "payload fails its SHA-256", message_id)
            self._drop(partial.tags)
            return None
        return data, partial.tags

    def expire(self) -> None:
        """Drop partials that got no new chunk for ``partial_seconds``."""
        now = time.monotonic()
        for message_id, partial in list(self._partials.items()):
            # (an acknowledgement that lost the connection clears every partial)
            if message_id in self._partials and now - partial.last > self.partial_seconds:
                self._reject("chunks expired", partial.signer, "dropped %d of %d chunks of %s "
                             "from %s: no new chunk for %.0f s", len(partial.chunks),
                             partial.count, message_id,
                             repr(partial.signer) if partial.signer else "an unsigned sender",
                             now - partial.last, authenticated=bool(partial.signer))
                self._discard(message_id)
        self.rejections.flush()

    def _reject(self, reason: str, sender: str, message: str, *args: object,
                authenticated: bool = False, level: int = logging.WARNING) -> None:
        """Log a dropped frame within its sender's budget: only a signed manifest's signer is
        authenticated, and only for what the signature covers (frames themselves are not)."""
        self.rejections.refuse(reason, sender, message, *args, authenticated=authenticated,
                               level=level)

    def _discard(self, message_id: str) -> None:
        partial = self._partials.pop(message_id)
        self._refuse(message_id)
        self._drop(partial.tags)

    def _refuse(self, message_id: str) -> None:
        """Its later frames are dropped on arrival: the message can no longer complete."""
        self._refused[message_id] = None
        if len(self._refused) > _REFUSED_IDS:
            self._refused.popitem(last=False)


def _proof(headers: dict[str, Any]) -> bytes:
    packed, signature = headers.get("fb-manifest"), headers.get("fb-signature")
    if isinstance(packed, bytes) and isinstance(signature, bytes):
        return signature + packed
    return b""
