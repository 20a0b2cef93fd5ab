"""DH-PSI primitives: blinding commutes, so equal ids meet and others do not."""

from __future__ import annotations

import pytest

from crypto import CryptoError
from crypto.psi import PsiKey, hash_to_group, split_points


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
