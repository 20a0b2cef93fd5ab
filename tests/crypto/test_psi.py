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


def test_a_key_rebuilt_from_its_secret_blinds_alike() -> None:
    key = PsiKey()
    points = hash_to_group(["a", "b"])
    assert PsiKey(key.secret_bytes).blind(points) == key.blind(points)


def test_batched_blinding_on_processes_equals_blinding_in_one_go() -> None:
    # Prepare: more points than one batch, so batches go to two pool processes
    key = PsiKey()
    ids = [f"customer-{k}" for k in range(300)]
    points = hash_to_group(ids)
    seen: list[tuple[int, int]] = []
    # Execute
    blinded = key.blind_batched(b"".join(points), processes=2, batch=64,
                                progress=lambda done, total: seen.append((done, total)))
    hashed = key.hash_and_blind(ids, processes=2, batch=64)
    inline = key.hash_and_blind(ids, processes=1, batch=64)
    # Assert
    expected = b"".join(key.blind(points))
    assert blinded == hashed == inline == expected
    assert seen == [(64, 300), (128, 300), (192, 300), (256, 300), (300, 300)]


def test_batched_blinding_refuses_a_low_order_point() -> None:
    points = hash_to_group([f"id{k}" for k in range(40)])
    points[33] = b"\x00" * 32  # low order, in the second batch
    with pytest.raises(CryptoError, match="low order"):
        PsiKey().blind_batched(b"".join(points), processes=2, batch=16)
    with pytest.raises(CryptoError, match="low order"):
        PsiKey().blind_batched(b"".join(points), processes=1, batch=16)
    with pytest.raises(CryptoError):
        PsiKey().blind_batched(b"\x01" * 33)
