"""Instance spaces (sets of row positions) as bitmaps or run-length gaps (seed 002, 4.3).

A dense set travels as a bitmap (n/8 bytes); a sparse one as the gaps between consecutive
members in LEB128 varints. The encoder picks whichever is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from messages import DecodeError

BITMAP = 0
GAPS = 1


@dataclass(frozen=True, slots=True)
class InstanceSpace:
    """A subset of ``size`` positions."""

    size: int
    encoding: int
    data: bytes


def encode_mask(mask: np.ndarray) -> InstanceSpace:
    """Encode a boolean mask in the smaller of the two encodings."""
    mask = np.asarray(mask, dtype=bool)
    bitmap = np.packbits(mask).tobytes()
    members = np.flatnonzero(mask)
    if members.size * 2 < len(bitmap):  # a gap costs at least one byte
        gaps = _varints(np.diff(members, prepend=-1))
        if len(gaps) < len(bitmap):
            return InstanceSpace(int(mask.size), GAPS, gaps)
    return InstanceSpace(int(mask.size), BITMAP, bitmap)


def decode_mask(space: InstanceSpace, expected_size: int) -> np.ndarray:
    """The boolean mask, after checking it describes ``expected_size`` positions."""
    if space.size != expected_size:
        raise DecodeError(f"instance space of {space.size} rows, expected {expected_size}")
    if space.encoding == BITMAP:
        if len(space.data) != (space.size + 7) // 8:
            raise DecodeError("bitmap length does not match its size")
        return np.unpackbits(np.frombuffer(space.data, dtype=np.uint8), count=space.size).astype(bool)
    if space.encoding == GAPS:
        positions = np.cumsum(_read_varints(space.data, space.size)) - 1
        if positions.size and (positions[-1] >= space.size or (np.diff(positions) <= 0).any()):
            raise DecodeError("run-length gaps point outside the instance space")
        mask = np.zeros(space.size, dtype=bool)
        mask[positions] = True
        return mask
    raise DecodeError(f"unknown instance-space encoding {space.encoding}")


def _varints(values: np.ndarray) -> bytes:
    out = bytearray()
    for v in values.tolist():
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _read_varints(data: bytes, size: int) -> np.ndarray:
    """Gaps between members of a ``size``-position space: each at most ``size``, at most
    ``size`` of them (checked as they are read: the sender declares neither)."""
    values: list[int] = []
    value = shift = 0
    if len(data) > 10 * size:  # a gap takes at most 10 bytes (64 bits in 7-bit groups)
        raise DecodeError(f"{len(data)} bytes of run-length gaps for {size} positions")
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise DecodeError("varint too long")
        else:
            if value == 0:
                raise DecodeError("zero gap in run-length instance space")
            if value > size or len(values) == size:
                raise DecodeError("run-length gaps point outside the instance space")
            values.append(value)
            value = shift = 0
    if shift:
        raise DecodeError("truncated varint")
    return np.array(values, dtype=np.int64)
