"""Message kinds, declared by the protocols that own them.

Each protocol's messages module calls :func:`declare` once with its kinds: a name, the number it
has on the wire and its body class, grouped by what the kind is (an opener, a command, a reply,
peer mail between parties, work for a party's own helper processes). The envelope's tables
(``MsgType``, ``BODY_TYPES``, ``COMMANDS``, ``OPENERS``, ``REPLIES``, ``PEER_MAIL``, ``WORK``)
are built from those declarations and nothing else: a kind nobody declared does not decode, and
a kind declared as a command is never filed as peer mail.

Protocols outside this package (a plug-in, a test's toy protocol) are named by the
``FEDBOOST_PROTOCOLS`` environment variable: packages, comma-separated, each with a ``messages``,
a ``protocol`` and a ``steps`` module that the three layers' registries import
(``import_extra``). Worker processes inherit the variable, so they find the same protocols as
the process that started them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator, Set
from typing import Any

EXTRA_PROTOCOLS_ENV = "FEDBOOST_PROTOCOLS"
"""Packages of protocols outside fedboost, comma-separated (see ``docs/protocols.md``)."""


class Kind(int):
    """One message kind: its number on the wire, its name and the protocol declaring it."""

    name: str
    protocol: str

    def __new__(cls, number: int, name: str, protocol: str) -> Kind:
        kind = super().__new__(cls, number)
        kind.name, kind.protocol = name, protocol
        return kind

    @property
    def value(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"<MsgType.{self.name}: {int(self)}>"

    __str__ = int.__repr__

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return MsgType, (int(self),)


_BY_NUMBER: dict[int, Kind] = {}


def kind_of(number: Any) -> Kind:
    """The declared kind with wire number ``number`` (``MsgType(number)``); ValueError if none."""
    try:
        return _BY_NUMBER[number]
    except (KeyError, TypeError):
        raise ValueError(f"{number!r} is not a declared message kind") from None


class _Kinds(type):
    """``MsgType.NAME``, ``MsgType(number)`` and ``for kind in MsgType``, as an enum reads."""

    def __call__(cls, number: Any) -> Kind:
        return kind_of(number)

    def __iter__(cls) -> Iterator[Kind]:
        return iter(sorted(_BY_NUMBER.values()))

    def __len__(cls) -> int:
        return len(_BY_NUMBER)

    def __contains__(cls, kind: object) -> bool:
        return isinstance(kind, Kind) and _BY_NUMBER.get(int(kind)) is kind

    def __getattr__(cls, name: str) -> Kind:
        """Only for a name no protocol declared (``declare`` sets each declared one on the
        class): so a type checker reads ``MsgType.NAME`` as a ``Kind``."""
        raise AttributeError(f"no protocol declared the message kind {name}")


class MsgType(metaclass=_Kinds):
    """Every declared message kind, by name (``MsgType.ACK``) or wire number
    (``MsgType(100)``); its body class is ``BODY_TYPES[kind]``."""


class KindSet(Set[Kind]):
    """A set of kinds that grows only through :func:`declare` (read-only to everyone else)."""

    def __init__(self, kinds: Iterable[Kind] = ()) -> None:
        self._kinds = set(kinds)

    def __contains__(self, kind: object) -> bool:
        return kind in self._kinds

    def __iter__(self) -> Iterator[Kind]:
        return iter(sorted(self._kinds))

    def __len__(self) -> int:
        return len(self._kinds)

    def __repr__(self) -> str:
        return f"KindSet({sorted(k.name for k in self._kinds)})"

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> KindSet:  # type: ignore[override]  # below
        # Set's operators (a | b, a - b) build their results here: a KindSet, where typing's
        # stub says an AbstractSet of any element type
        return cls(it)


BODY_TYPES: dict[Kind, type] = {}
OPENERS = KindSet()
"""Commands that open a job at a party: their bodies name the protocol and every party's role."""
COMMANDS = KindSet()
"""What a flow sends a party (openers included); a party answers each with a reply."""
REPLIES = KindSet()
"""A party's answers to a flow's commands (a helper process's failed shard also answers with
``ERROR``, to its own party)."""
PEER_MAIL = KindSet()
"""What parties send one another within a job (and a party's helper processes back to it): a
job's mailbox files them. A peer that opened its job first may send some before this party's
opener arrives: a worker keeps them until it does (``workers.early_mail``)."""
WORK = KindSet()
"""What a party's coordinating process hands to its own helper processes: shards of a step, and
the data those shards share."""
UNRECORDED = KindSet()
"""Commands a worker answers without putting them on its durable record of answered commands
(an fsync each): a scoring service sends thousands a second. Answering one again sends the
same decisions to the same active party, which already has them; recent replays are still
refused by their nonce, and after a worker restart the session they name is no longer open."""
TRANSIENT = KindSet()
"""Kinds the broker need not write to disk: a scoring round is worth nothing after its timeout,
and one lost with the broker is answered 503 and asked again (a persistent message waits for
the broker's fsync: about 0.5 ms more per hop on loopback, and a long tail)."""

Declared = dict[str, tuple[int, type]]
"""name -> (wire number, body class)."""


def declare(protocol: str, *, openers: Declared | None = None, commands: Declared | None = None,
            replies: Declared | None = None, peer: Declared | None = None,
            work: Declared | None = None, unrecorded: Iterable[str] = (),
            transient: Iterable[str] = ()) -> None:
    """Declare ``protocol``'s message kinds. A name or number another declaration holds is an
    error (wire numbers never change meaning); declaring the very same kind again is not."""
    groups = ((openers, (OPENERS, COMMANDS)), (commands, (COMMANDS,)), (replies, (REPLIES,)),
              (peer, (PEER_MAIL,)), (work, (WORK,)))
    for declared, sets in groups:
        for name, (number, body) in (declared or {}).items():
            kind = _new_kind(protocol, name, number, body)
            for kinds in sets:
                kinds._kinds.add(kind)
    for names, kinds in ((unrecorded, UNRECORDED), (transient, TRANSIENT)):
        for name in names:
            kinds._kinds.add(getattr(MsgType, name))


def _new_kind(protocol: str, name: str, number: int, body: type) -> Kind:
    same = _BY_NUMBER.get(number)
    if same is not None:
        if same.name == name and same.protocol == protocol and BODY_TYPES[same] is body:
            return same
        raise ValueError(f"message kind {number} is {same.name} ({same.protocol}); "
                         f"{protocol} cannot declare it as {name}")
    if name in vars(MsgType):
        raise ValueError(f"message kind {name} is declared twice")
    kind = Kind(number, name, protocol)
    _BY_NUMBER[number] = kind
    BODY_TYPES[kind] = body
    setattr(MsgType, name, kind)
    return kind


def extra_protocols() -> list[str]:
    """The packages ``FEDBOOST_PROTOCOLS`` names."""
    return [name.strip() for name in os.environ.get(EXTRA_PROTOCOLS_ENV, "").split(",")
            if name.strip()]


def import_extra(layer: str) -> None:
    """Import the ``layer`` module (``messages``, ``protocol`` or ``steps``) of every package
    ``FEDBOOST_PROTOCOLS`` names: importing it declares what it holds."""
    for package in extra_protocols():
        importlib.import_module(f"{package}.{layer}")
