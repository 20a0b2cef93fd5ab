"""Generic msgpack codec for frozen message dataclasses.

A body is encoded as the msgpack array of its fields in declaration order; decoding walks the
type hints and checks every value's type, so a body of the wrong shape is a ``DecodeError``
before any handler sees it. Supported field types: bool, int, float, str, bytes, list[T] and
nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar

from messages import DecodeError

T = TypeVar("T")
_SCALARS = (bool, int, float, str, bytes)


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


def from_wire(cls: type[T], raw: Any, where: str = "body") -> T:
    """Rebuild a ``cls`` from :func:`to_wire` output, checking every field."""
    return typing.cast(T, _decode(cls, raw, where))


def _decode(tp: Any, raw: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        fields = _hints(tp)
        if not isinstance(raw, list) or len(raw) != len(fields):
            raise DecodeError(f"{where}: expected {len(fields)} fields of {tp.__name__}")
        return tp(**{name: _decode(ftp, v, f"{where}.{name}") for (name, ftp), v in zip(fields, raw)})
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(raw, list):
            raise DecodeError(f"{where}: expected a list")
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(raw)]
    if origin in (typing.Union, types.UnionType):
        raise DecodeError(f"{where}: union fields are not supported")
    if tp in _SCALARS:
        # bool is a subclass of int: only a bool field accepts True/False
        if not isinstance(raw, tp) or (tp is not bool and isinstance(raw, bool)):
            raise DecodeError(f"{where}: expected {tp.__name__}")
        return raw
    raise DecodeError(f"{where}: unsupported field type {tp!r}")
