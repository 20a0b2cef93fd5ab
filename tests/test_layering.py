"""Dependency direction (DESIGN.md): boosting, crypto and messages import nothing of ours;
flows import messages (and their own schema) but never boosting, crypto, workers or numpy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = {"boosting", "crypto", "messages", "workers", "flows", "fedboost"}
ALLOWED = {
    "boosting": {"boosting"},
    "crypto": {"crypto"},
    "messages": {"messages"},
    "workers": {"workers", "boosting", "crypto", "messages"},
    "flows": {"flows", "messages"},
}
FORBIDDEN_THIRD_PARTY = {"flows": {"numpy", "gmpy2", "phe", "numba"}, "workers": {"prefect"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    for path in (REPO / package).rglob("*.py"):
        imported = _imports(path)
        ours = imported & OURS
        assert ours <= ALLOWED[package], f"{path.relative_to(REPO)} imports {ours - ALLOWED[package]}"
        banned = imported & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not banned, f"{path.relative_to(REPO)} imports {banned}"
