"""A typed codec for a party's job state: msgpack, and nothing in a file that can run code.

msgpack's own values (None, bool, int, float, str, bytes, list, dict) pass through; tuples, sets, big
integers, GMP integers, numpy arrays and scalars of plain dtypes, and dataclasses of an explicit
allowlist become extension types. A dataclass is written as its allowlisted name and its
constructor's fields. Decoding looks the name up in the allowlist (it never imports or calls
anything by a name read from the data), refuses unknown fields, and rebuilds the value with its
constructor, so derived fields (a Paillier key's precomputations) are recomputed, not read.
An allowlisted class must therefore be rebuildable from its ``init`` fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from crypto._gmp import mpz

_TUPLE, _INT, _MPZ, _ARRAY, _SCALAR, _DATACLASS, _SET = range(1, 8)
_MPZ_TYPE = type(mpz(0))
DTYPES: dict[str, np.dtype[Any]] = {
    np.dtype(t).str: np.dtype(t)
    for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
              np.uint64, np.float32, np.float64)
}
"""The array element types a state may hold, by their numpy type string (never ``object``)."""


class StateCodecError(ValueError):
    """A value that the codec may not write, or data it may not rebuild."""


def type_names(*classes: type) -> dict[str, type]:
    """An allowlist: each dataclass by its module and qualified name, or by the name in its
    ``STORED_AS`` (a class that moved to another module keeps the name checkpoints already
    written know it by)."""
    allowed = {}
    for cls in classes:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls!r} is not a dataclass")
        allowed[getattr(cls, "STORED_AS", f"{cls.__module__}.{cls.__qualname__}")] = cls
    return allowed


def pack(value: Any, allowed: Mapping[str, type]) -> bytes:
    """Encode ``value``; a dataclass outside ``allowed`` or any other type is an error."""
    names = {cls: name for name, cls in allowed.items()}

    def default(obj: Any) -> msgpack.ExtType:
        return _ext(obj, names, default)

    try:
        return msgpack.packb(value, default=default, strict_types=True, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise StateCodecError(f"cannot encode the state: {exc}") from None


def unpack(data: bytes | memoryview, allowed: Mapping[str, type]) -> Any:
    """Rebuild what :func:`pack` wrote, accepting only ``allowed`` dataclasses."""

    def hook(code: int, raw: bytes) -> Any:
        if code in (_INT, _MPZ):  # the integer's bytes themselves
            value = int.from_bytes(raw, "big", signed=True)
            return mpz(value) if code == _MPZ else value
        return _rebuild(code, msgpack.unpackb(raw, ext_hook=hook, raw=False, strict_map_key=False),
                        allowed)

    try:
        return msgpack.unpackb(data, ext_hook=hook, raw=False, strict_map_key=False)
    except StateCodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on malformed data
        raise StateCodecError(f"not an encoded state: {exc}") from None


def _ext(obj: Any, names: Mapping[type, str], default: Any) -> msgpack.ExtType:
    def nested(code: int, value: Any) -> msgpack.ExtType:
        return msgpack.ExtType(code, msgpack.packb(value, default=default, strict_types=True,
                                                   use_bin_type=True))

    kind = type(obj)
    if kind is tuple:
        return nested(_TUPLE, list(obj))
    if kind is set:  # of ints or strings, sorted: the same state always writes the same bytes
        if not (all(type(x) is int for x in obj) or all(type(x) is str for x in obj)):
            raise TypeError("a set of other values than ints or strings may not be stored")
        return nested(_SET, sorted(obj))
    if kind is int:  # beyond 64 bits (msgpack writes the others itself)
        return msgpack.ExtType(_INT, _int_bytes(obj))
    if kind is _MPZ_TYPE:
        return msgpack.ExtType(_MPZ, _int_bytes(int(obj)))
    if kind is np.ndarray and obj.dtype.str in DTYPES:
        # the memory order numpy's own pickling keeps, so a resumed state computes identically
        order = "F" if obj.flags.f_contiguous and not obj.flags.c_contiguous else "C"
        return nested(_ARRAY, [obj.dtype.str, list(obj.shape), order, obj.tobytes(order=order)])
    if isinstance(obj, np.generic) and obj.dtype.str in DTYPES:
        return nested(_SCALAR, [obj.dtype.str, obj.tobytes()])
    if isinstance(obj, (np.ndarray, np.generic)):
        raise TypeError(f"numpy values of dtype {obj.dtype} may not be stored")
    if kind in names:
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
        return nested(_DATACLASS, [names[kind], fields])
    raise TypeError(f"a {kind.__module__}.{kind.__qualname__} may not be stored "
                    f"(not an allowlisted type)")


def _int_bytes(value: int) -> bytes:
    return value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)


def _rebuild(code: int, raw: Any, allowed: Mapping[str, type]) -> Any:
    if code == _TUPLE and isinstance(raw, list):
        return tuple(raw)
    if code == _SET and isinstance(raw, list):
        try:
            return set(raw)
        except TypeError:
            raise StateCodecError("a set of unhashable values") from None
    if code == _ARRAY:
        return _array(raw)
    if code == _SCALAR and isinstance(raw, list) and len(raw) == 2:
        dtype = _dtype(raw[0])
        if not isinstance(raw[1], bytes) or len(raw[1]) != dtype.itemsize:
            raise StateCodecError(f"a {dtype} scalar needs {dtype.itemsize} bytes")
        return np.frombuffer(raw[1], dtype=dtype)[0]
    if code == _DATACLASS and isinstance(raw, list) and len(raw) == 2:
        return _dataclass(raw[0], raw[1], allowed)
    raise StateCodecError(f"malformed value of extension type {code}")


def _dtype(name: Any) -> np.dtype[Any]:
    if not isinstance(name, str) or name not in DTYPES:
        raise StateCodecError(f"array type {name!r} is not allowed")
    return DTYPES[name]


def _array(raw: Any) -> np.ndarray:
    if not (isinstance(raw, list) and len(raw) == 4 and isinstance(raw[1], list)
            and raw[2] in ("C", "F") and isinstance(raw[3], bytes)):
        raise StateCodecError("malformed array")
    dtype, shape, order, data = _dtype(raw[0]), raw[1], raw[2], raw[3]
    if not all(type(n) is int and n >= 0 for n in shape):
        raise StateCodecError(f"bad array shape {shape!r}")
    if math.prod(shape) * dtype.itemsize != len(data):
        raise StateCodecError(f"array of shape {shape} needs {math.prod(shape) * dtype.itemsize} "
                              f"bytes, has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy(order=order)


def _dataclass(name: Any, fields: Any, allowed: Mapping[str, type]) -> Any:
    cls = allowed.get(name) if isinstance(name, str) else None
    if cls is None:
        raise StateCodecError(f"type {name!r} is not allowed here")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    if not isinstance(fields, dict) or not set(fields) <= known:
        extra = sorted(map(str, set(fields) - known)) if isinstance(fields, dict) else fields
        raise StateCodecError(f"{name}: unknown fields {extra!r}")
    try:
        return cls(**fields)
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise StateCodecError(f"{name}: cannot rebuild it: {exc}") from None
