"""Typed msgpack codec for frozen message dataclasses.

A body is encoded as the msgpack array of its fields in declaration order (``to_wire``, then
``msgpack.packb``). Decoding reads the bytes in place with a ``WireReader``, field by field as
the type hints say, and checks every value's type as it goes, so a body of the wrong shape is a
``DecodeError`` before any handler sees it. Supported field types: bool, int, float, str, bytes,
list[T] and nested dataclasses.

Memory: decoding makes the decoded values and nothing else (no generic tree of Python objects
first, no copy of the message), and charges each object it makes against a budget of twice the
message's size plus ``DECODE_FLOOR_BYTES``. A list is charged for its slots from its header,
before one is allocated. So whatever a message declares, decoding it holds at most the message
and that budget: a 57 MiB envelope declaring a 60-million-item list is refused at once (the
generic decoder made 973 MiB of objects out of it in 79 s, issue 28).
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from functools import cache
from struct import unpack_from
from typing import Any, TypeVar

from messages import DecodeError

T = TypeVar("T")
DECODE_FLOOR_BYTES = 16 * 1024 * 1024
"""What any message may decode to whatever its size: a scoring round's 65,536 ids of 20
characters take 5 MiB as Python strings, a horizontal job's 100,000 column names about 9 MiB."""
_LIST_BYTES, _SLOT_BYTES = 56, 8
"""A list object, and each of its slots (sys.getsizeof on 64-bit CPython)."""
_INT_BYTES, _FLOAT_BYTES, _STR_BYTES, _BYTES_BYTES = 32, 24, 49, 33
"""An int beyond the small-int cache, a float, and a str or bytes object before its content."""


@cache
def _hints(cls: type) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]


def to_wire(value: Any) -> Any:
    """Dataclasses become arrays of their fields; lists are walked; scalars pass through."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [to_wire(getattr(value, name)) for name, _ in _hints(type(value))]
    if isinstance(value, (list, tuple)):
        return [to_wire(v) for v in value]
    return value


class _Misfit(DecodeError):
    """A value of the wrong type or size, with the path to it (filled in on the way out)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


class WireReader:
    """msgpack values of expected types, read one after the other from a buffer in place.

    Every object it makes is charged against ``budget`` bytes; a value that would exceed it,
    declares more than the buffer holds, or is of another type raises ``DecodeError``.
    """

    __slots__ = ("data", "pos", "budget")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        self.data = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.pos = 0
        self.budget = 2 * len(self.data) + DECODE_FLOOR_BYTES

    def at_end(self) -> bool:
        """Whether every byte was read."""
        return self.pos == len(self.data)

    def read_int(self) -> int:
        """An integer (not a bool)."""
        data, pos = self.data, self.pos
        code = data[pos]
        if code <= 0x7F:  # fixints: CPython's cached small ints, nothing to charge
            self.pos = pos + 1
            return code
        if code >= 0xE0:
            self.pos = pos + 1
            return code - 0x100
        fmt = _INT_FORMATS.get(code)
        if fmt is None:
            raise _Misfit("expected int")
        value = unpack_from(fmt[0], data, pos + 1)[0]
        self.pos = pos + 1 + fmt[1]
        self.budget -= _INT_BYTES
        if self.budget < 0:
            raise _Misfit(_OVER_BUDGET)
        return int(value)

    def read_float(self) -> float:
        """A float (an int is refused, as ``isinstance`` would)."""
        data, pos = self.data, self.pos
        code = data[pos]
        if code == 0xCB:
            value, self.pos = unpack_from(">d", data, pos + 1)[0], pos + 9
        elif code == 0xCA:
            value, self.pos = unpack_from(">f", data, pos + 1)[0], pos + 5
        else:
            raise _Misfit("expected float")
        self._charge(_FLOAT_BYTES)
        return float(value)

    def read_bool(self) -> bool:
        """True or False (0 and 1 are ints, refused)."""
        code = self.data[self.pos]
        if code not in (0xC2, 0xC3):
            raise _Misfit("expected bool")
        self.pos += 1
        return code == 0xC3

    def read_str(self, limit: int | None = None) -> str:
        """A UTF-8 string (of at most ``limit`` bytes, checked before it is decoded)."""
        data, pos = self.data, self.pos
        code = data[pos]
        if 0xA0 <= code <= 0xBF:
            start, n = pos + 1, code & 0x1F
        elif code == 0xD9:
            start, n = pos + 2, data[pos + 1]
        elif code == 0xDA:
            start, n = pos + 3, unpack_from(">H", data, pos + 1)[0]
        elif code == 0xDB:
            start, n = pos + 5, unpack_from(">I", data, pos + 1)[0]
        else:
            raise _Misfit("expected str")
        end = start + n
        if end > len(data):
            raise _Misfit(f"declares {n} bytes, more than the message holds")
        if limit is not None and n > limit:
            raise _Misfit(f"a str of {n} bytes, beyond {limit}")
        self.pos = end
        self.budget -= n + _STR_BYTES
        if self.budget < 0:
            raise _Misfit(_OVER_BUDGET)
        try:
            return str(data[start:end], "utf-8")
        except UnicodeDecodeError:
            raise _Misfit("a str that is not UTF-8") from None

    def read_bytes(self) -> bytes:
        """A bin value, copied out (the one copy decoding makes of it)."""
        view = self.read_bytes_view()
        self._charge(len(view) + _BYTES_BYTES)
        return bytes(view)

    def read_bytes_view(self) -> memoryview:
        """A bin value as a view of the buffer: no copy, nothing charged but its length."""
        data, pos = self.data, self.pos
        code = data[pos]
        if code == 0xC4:
            start, n = pos + 2, data[pos + 1]
        elif code == 0xC5:
            start, n = pos + 3, unpack_from(">H", data, pos + 1)[0]
        elif code == 0xC6:
            start, n = pos + 5, unpack_from(">I", data, pos + 1)[0]
        else:
            raise _Misfit("expected bytes")
        if start + n > len(data):
            raise _Misfit(f"declares {n} bytes, more than the message holds")
        self.pos = start + n
        return data[start:start + n]

    def read_array_header(self, expected: str = "a list") -> int:
        """The item count of an array (a list, or a dataclass's fields), its slots charged."""
        data, pos = self.data, self.pos
        code = data[pos]
        if 0x90 <= code <= 0x9F:
            self.pos, n = pos + 1, code & 0x0F
        elif code == 0xDC:
            self.pos, n = pos + 3, unpack_from(">H", data, pos + 1)[0]
        elif code == 0xDD:
            self.pos, n = pos + 5, unpack_from(">I", data, pos + 1)[0]
        else:
            raise _Misfit(f"expected {expected}")
        if n > len(data) - self.pos:  # every item takes a byte at least
            raise _Misfit(f"declares {n} items, more than the message holds")
        self.budget -= _LIST_BYTES + _SLOT_BYTES * n
        if self.budget < 0:
            raise _Misfit(f"declares {n} items: more than a message of {len(data)} bytes "
                          f"may decode to")
        return int(n)

    def read_map_header(self) -> int:
        """The pair count of a map."""
        data, pos = self.data, self.pos
        code = data[pos]
        if 0x80 <= code <= 0x8F:
            self.pos, n = pos + 1, code & 0x0F
        elif code == 0xDE:
            self.pos, n = pos + 3, unpack_from(">H", data, pos + 1)[0]
        elif code == 0xDF:
            self.pos, n = pos + 5, unpack_from(">I", data, pos + 1)[0]
        else:
            raise _Misfit("expected a map")
        if 2 * n > len(data) - self.pos:
            raise _Misfit(f"declares {n} pairs, more than the message holds")
        return int(n)

    def _charge(self, nbytes: int) -> None:
        self.budget -= nbytes
        if self.budget < 0:
            raise _Misfit(_OVER_BUDGET)


_OVER_BUDGET = "decodes to more than twice the message's size (plus DECODE_FLOOR_BYTES)"
_INT_FORMATS = {0xCC: (">B", 1), 0xCD: (">H", 2), 0xCE: (">I", 4), 0xCF: (">Q", 8),
                0xD0: (">b", 1), 0xD1: (">h", 2), 0xD2: (">i", 4), 0xD3: (">q", 8)}
_SCALARS: dict[Any, Callable[[WireReader], Any]] = {
    bool: WireReader.read_bool, int: WireReader.read_int, float: WireReader.read_float,
    str: WireReader.read_str, bytes: WireReader.read_bytes}


def read_typed(cls: type[T], reader: WireReader) -> T:
    """Read a ``cls`` (a dataclass of the supported field types) where ``reader`` stands."""
    return typing.cast(T, _decoder(typing.cast(Any, cls))(reader))  # a class is hashable


class decoding:  # noqa: N801 - used as a context manager, like contextlib's
    """Turns what a ``WireReader`` raises inside into a ``DecodeError`` naming ``what`` and the
    path to the misfit value (``SCORE_ROWS.ids[3]: expected str``)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if isinstance(exc, _Misfit):
            raise DecodeError(f"{self.what}{''.join(reversed(exc.path))}: {exc.reason}") from None
        if isinstance(exc, (IndexError, struct.error)):  # a value's header cut short
            raise DecodeError(f"{self.what}: the message ends in the middle of a value") from None


@cache
def _decoder(tp: Any) -> Callable[[WireReader], Any]:
    """The function that reads a ``tp`` (made once per type)."""
    if dataclasses.is_dataclass(tp):
        return _dataclass_decoder(tp)
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return _list_decoder(_decoder(item))
    if origin in (typing.Union, types.UnionType):
        raise DecodeError(f"union fields are not supported ({tp!r})")
    if tp in _SCALARS:
        return _SCALARS[tp]
    raise DecodeError(f"unsupported field type {tp!r}")


def _dataclass_decoder(cls: Any) -> Callable[[WireReader], Any]:
    fields = [(f".{name}", _decoder(ftp)) for name, ftp in _hints(cls)]
    expected = f"{len(fields)} fields of {cls.__name__}"
    size = getattr(cls, "__basicsize__", 64) + 16  # the object and its GC header

    def read(reader: WireReader) -> Any:
        if reader.read_array_header(expected) != len(fields):
            raise _Misfit(f"expected {expected}")
        reader._charge(size)
        values = []
        for name, read_field in fields:
            try:
                values.append(read_field(reader))
            except _Misfit as exc:
                exc.path.append(name)
                raise
        try:
            return cls(*values)
        except ValueError as exc:  # a type that checks its fields (``TreeParams``'s bounds)
            raise _Misfit(str(exc)) from None

    return read


def _list_decoder(read_item: Callable[[WireReader], Any]) -> Callable[[WireReader], list[Any]]:
    def read(reader: WireReader) -> list[Any]:
        n = reader.read_array_header()
        items: list[Any] = []
        try:
            for _ in range(n):
                items.append(read_item(reader))
        except _Misfit as exc:
            exc.path.append(f"[{len(items)}]")
            raise
        return items

    return read
