"""Envelopes ``{version, job, task, sender, recipient, kind, body}`` in msgpack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

# every protocol's messages module declares its kinds (``messages.kinds.declare``): one name
# per protocol here, and the packages ``FEDBOOST_PROTOCOLS`` names
from messages import bodies, forest, horizontal, scoring, secureboost, simfl  # noqa: F401
from messages import DecodeError, UnknownMessageType
from messages.codec import WireReader, decoding, read_typed, to_wire
from messages.kinds import (BODY_TYPES, COMMANDS, OPENERS, PEER_MAIL,  # noqa: F401 (the tables)
                            REPLIES, TRANSIENT, UNRECORDED, WORK, Kind, MsgType, import_extra,
                            kind_of)
from messages.names import JOB_NAME_RULE, is_job_name

__all__ = ["BODY_TYPES", "COMMANDS", "MAX_MESSAGE_BYTES", "OPENERS", "PEER_MAIL", "REPLIES",
           "TRANSIENT", "UNRECORDED", "WIRE_VERSION", "WORK", "Envelope", "Kind", "MsgType",
           "decode_envelope", "encode_envelope"]
"""What protocols import from here: the envelope, and the kinds' tables (``messages.kinds``)."""

WIRE_VERSION = 10
"""2: a row's packed (g, h, count) slots are sized by what they hold (``crypto.encoding``); a
version-1 party would cut the bin sums apart in the wrong places, so the versions refuse each other.
3: horizontal set-up counts cells of a public grid instead of sending quantile summaries, and a
tree's root histograms are sealed until a round key is released (``messages.horizontal``).
4: SimFL's gradient sums are randomised for every builder row and its hash functions come from
a secret the members exchange sealed (``S_LSH_KEY``, ``S_LSH_SECRET``); an older member would
send exact sums.
5: the openers of SecureBoost, horizontal and SimFL carry the tree parameters nested
(``messages.params.TreeParams``) instead of as fields of their specs; checkpoints of version 4
(format 3) are refused (``workers.checkpoint``).
6: jobs name their encryption scheme (``JobSpec.scheme``, ``ForestSpec.scheme``: Paillier or
Okamoto-Uchiyama), and so do a party's own histogram shards; an older party would read an
Okamoto-Uchiyama modulus as a Paillier one.
7: horizontal and SimFL train multiclass: the shared cuts (``SharedCuts.classes``) and SimFL's
hash values and similar rows (``RowHashes.classes``, ``SimilarRows.classes``) carry the classes; SecureBoost's and horizontal
specs carry differential privacy's settings (``dp_epsilon``, ``dp_clip``, ``dp_seed``,
``dp_per_ensemble``).
8: SimFL members send the aggregator keyed bucket ids (``RowHashes``, 8 bytes each) instead of
hash values, and a contributor sends one noisy h total per tree (``SimilarGradients.h_total``)
instead of h per row; a version-7 party would read the ids as windows and send per-row h.
9: SecureBoost's split choices may ask the one data provider to build the next level at once
(``SplitChoices.build_ahead``, with the children's ids and the active party's own splits); a
version-8 party would apply the splits and wait for positions that never come.
10: a forest's opener carries its parameters nested (``ForestSpec.params``, a
``messages.forest.ForestParams`` checked on arrival, without ``min_trees``, which only the flow
reads); a version-9 party would read the nested parameters as the tree count."""
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Refuse to parse anything larger; transports chunk big payloads well below this."""
import_extra("messages")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message: who sent it to whom, for which job and task, and its typed body."""

    job: str
    task: str
    sender: str
    recipient: str
    kind: Kind
    body: Any
    version: int = WIRE_VERSION


def encode_envelope(env: Envelope) -> bytes:
    """Serialise an envelope; the body must be of the kind's class."""
    expected = BODY_TYPES[env.kind]
    if not isinstance(env.body, expected):
        raise TypeError(f"{env.kind.name} needs a {expected.__name__} body")
    return msgpack.packb(
        {"version": env.version, "job": env.job, "task": env.task, "sender": env.sender,
         "recipient": env.recipient, "kind": int(env.kind), "body": to_wire(env.body)},
        use_bin_type=True,
    )


def decode_envelope(data: bytes | memoryview) -> Envelope:
    """Parse and validate an envelope; any malformed input raises ``DecodeError``.

    The body is read in place as its kind's class (``messages.codec``): decoding holds nothing
    but the message and what it decodes to, at most twice its size plus
    ``codec.DECODE_FLOOR_BYTES``. The body comes last, after the kind that names its class (as
    ``encode_envelope`` writes it).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    reader = WireReader(data)
    head: dict[str, Any] = {}
    key = ""
    with decoding("envelope"):
        for _ in range(reader.read_map_header()):
            key = reader.read_str(_NAME_BYTES)
            if key in head or key not in _HEAD:
                raise DecodeError(f"envelope field {key!r} unknown or repeated")
            if key == "body":
                break
            head[key] = (reader.read_int() if key in ("version", "kind")
                         else reader.read_str(4 * _NAME_BYTES))
    if len(head) != len(_HEAD) - 1 or key != "body":
        raise DecodeError(f"envelope must be a map of {', '.join(_HEAD)}, the body last")
    if head["version"] != WIRE_VERSION:
        raise DecodeError(f"wire version {head['version']!r}, expected {WIRE_VERSION}")
    job, task, sender, recipient = (head[k] for k in ("job", "task", "sender", "recipient"))
    if max(len(job), len(task), len(sender), len(recipient)) > _NAME_BYTES:
        raise DecodeError("envelope job, task, sender and recipient must be short strings")
    if not is_job_name(job):  # it becomes a folder name at every party
        raise DecodeError(f"envelope job {job!r} is not a job name ({JOB_NAME_RULE})")
    try:
        kind = kind_of(head["kind"])
    except ValueError as exc:
        raise UnknownMessageType(f"unknown message kind {head['kind']!r}") from exc
    with decoding(kind.name):
        body: Any = read_typed(BODY_TYPES[kind], reader)
    if not reader.at_end():
        raise DecodeError(f"{kind.name}: {len(data) - reader.pos} bytes after the body")
    return Envelope(job=job, task=task, sender=sender, recipient=recipient, kind=kind,
                    body=body)


_HEAD = ("version", "job", "task", "sender", "recipient", "kind", "body")
_NAME_BYTES = 256
"""Characters of a job, task, sender or recipient name at most (4 UTF-8 bytes each)."""
