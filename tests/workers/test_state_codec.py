"""The checkpoint state codec: what it writes comes back exactly, and what it reads can only
rebuild allowlisted dataclasses through their constructors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from boosting.params import BoostParams
from crypto._gmp import mpz
from workers._state_codec import DTYPES, StateCodecError, pack, type_names, unpack


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    label: str = ""


ALLOWED = type_names(Point, BoostParams)

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
           | st.text(max_size=8) | st.binary(max_size=8)
           | st.integers().map(mpz) | st.builds(Point, st.integers(), st.text(max_size=4)))
arrays = hnp.arrays(st.sampled_from(sorted(DTYPES)), hnp.array_shapes(min_dims=0, max_dims=3,
                                                                      min_side=0, max_side=4))
numpy_scalars = arrays.filter(lambda a: a.ndim == 0).map(lambda a: a[()])
values = st.recursive(
    scalars | arrays | numpy_scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4)),
    max_leaves=20)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types, all the way down (arrays: dtype, shape, order, bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return (a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                and a.flags.f_contiguous == b.flags.f_contiguous and b.flags.writeable)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.generic):
        return a.tobytes() == b.tobytes()
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_value_comes_back_exactly(value: Any) -> None:
    assert _same(unpack(pack(value, ALLOWED), ALLOWED), value)


@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=5)))
def test_array_memory_order_is_kept(a: np.ndarray) -> None:
    """A resumed state must compute exactly as before: Fortran arrays stay Fortran."""
    f = np.asfortranarray(a)
    back = unpack(pack({"c": a, "f": f}, {}), {})
    assert back["f"].flags.f_contiguous and back["c"].flags.c_contiguous
    assert back["f"].tobytes("A") == f.tobytes("A")


def test_big_and_negative_integers() -> None:
    for n in (0, -1, 2**63, -(2**63) - 1, 2**64, 2**4096 + 17, -(2**2049)):
        assert unpack(pack(n, {}), {}) == n and type(unpack(pack(n, {}), {})) is int
        assert type(unpack(pack(mpz(n), {}), {})) is type(mpz(0))


@pytest.mark.parametrize("value", [{1, object()}, np.array([object()]), np.array(["s"]), Point,
                                   BoostParams(), object(), np.complex128(1j)])
def test_what_is_not_allowlisted_is_not_written(value: Any) -> None:
    with pytest.raises(StateCodecError, match="may not be stored"):
        pack(value, type_names(Point))


def test_a_name_or_field_outside_the_allowlist_is_refused() -> None:
    data = pack(Point(1, "a"), ALLOWED)
    with pytest.raises(StateCodecError, match="Point' is not allowed"):
        unpack(data, type_names(BoostParams))
    extra = msgpack.packb(msgpack.ExtType(6, msgpack.packb(
        [f"{__name__}.Point", {"x": 1, "__class__": "os.system"}])))
    with pytest.raises(StateCodecError, match=r"unknown fields \['__class__'\]"):
        unpack(extra, ALLOWED)
    for name in ("os.system", "builtins.eval", "posix.system", "subprocess.Popen"):
        call = msgpack.packb(msgpack.ExtType(6, msgpack.packb([name, {}])))
        with pytest.raises(StateCodecError, match="is not allowed"):
            unpack(call, ALLOWED)


def test_constructors_check_what_they_rebuild() -> None:
    bad = msgpack.packb(msgpack.ExtType(6, msgpack.packb(
        ["boosting.params.BoostParams", {"max_depth": -3}])))
    with pytest.raises(StateCodecError, match="cannot rebuild"):
        unpack(bad, ALLOWED)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64) | values.map(lambda v: pack(v, ALLOWED)).flatmap(
    lambda b: st.tuples(st.just(b), st.integers(0, max(0, len(b) - 1)), st.integers(1, 255)))
       .map(lambda t: t[0][:t[1]] + bytes([t[0][t[1]] ^ t[2]]) + t[0][t[1] + 1:]
            if t[0] else t[0]))
def test_garbage_is_a_codec_error_or_a_value_never_anything_else(data: bytes) -> None:
    try:
        unpack(data, ALLOWED)
    except StateCodecError:
        pass


def test_sets_round_trip_and_write_the_same_bytes() -> None:
    from workers._state_codec import StateCodecError, pack, unpack

    value = {"open": {5, 1, 3}, "none": set()}
    data = pack(value, {})
    assert unpack(data, {}) == value
    assert pack({"open": {3, 5, 1}, "none": set()}, {}) == data
    import msgpack

    bad = msgpack.packb(msgpack.ExtType(7, msgpack.packb([[1], [2]])))
    with pytest.raises(StateCodecError):
        unpack(bad, {})
