"""DH-PSI primitives: blinding commutes, so equal ids meet and others do not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import CryptoError
from crypto.psi import PsiKey, elligator2_u, hash_to_group, split_points


def test_double_blinding_commutes_and_intersects() -> None:
    a, b = PsiKey(), PsiKey()
    mine = ["alice", "bob", "carol", "42", "ünïcode"]
    theirs = ["carol", "dave", "alice", "ünïcode", "042"]
    ab = a.blind(b.blind(hash_to_group(theirs)))
    ba = b.blind(a.blind(hash_to_group(mine)))
    common = {mine[i] for i, p in enumerate(ba) if p in set(ab)}
    assert common == {"alice", "carol", "ünïcode"}


def test_single_blinding_hides_ids() -> None:
    a, b = PsiKey(), PsiKey()
    assert set(a.blind(hash_to_group(["x", "y"]))).isdisjoint(b.blind(hash_to_group(["x", "y"])))


def test_bad_points_are_rejected() -> None:
    with pytest.raises(CryptoError):
        PsiKey().blind([b"\x00" * 32])  # low order
    with pytest.raises(CryptoError):
        split_points(b"\x01" * 33)


P = (1 << 255) - 19


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.text(max_size=40), min_size=1, max_size=20, unique=True))
def test_ids_map_to_distinct_points_on_the_curve(ids: list[str]) -> None:
    points = hash_to_group(ids)
    assert len(set(points)) == len(ids) and points == hash_to_group(ids)
    for point in points:
        u = int.from_bytes(point, "little")
        assert 0 <= u < P
        rhs = (u ** 3 + 486662 * u * u + u) % P
        assert pow(rhs, (P - 1) // 2, P) in (0, 1), "u is not the u-coordinate of a curve point"


@settings(max_examples=200, deadline=None)
@given(r=st.integers(0, 2**512 - 1))
def test_the_map_is_rfc_9380s_elligator_2(r: int) -> None:
    # written from the RFC's steps with Python's own pow (Euler's criterion), not GMP's Jacobi
    a, x1 = 486662, -486662 * pow(1 + 2 * (r % P) ** 2, -1, P) % P
    gx1 = (x1 ** 3 + a * x1 * x1 + x1) % P
    expected = x1 if pow(gx1, (P - 1) // 2, P) in (0, 1) else (-x1 - a) % P
    assert elligator2_u(r) == expected
