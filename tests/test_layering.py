"""Dependency direction (DESIGN.md): boosting and crypto import nothing of ours, messages
nothing but the declaration of the shared tree parameters (``boosting.params``, standard
library only);
flows import messages (and their own schema) but never boosting, crypto, workers or numpy;
``fedboost`` (the commands and the API) and ``benchmarks`` sit on top and never import
``tests``. And no module imports itself back through others: an import cycle, at module level or
inside a function (a late import that only hides one), is a failure. Nor do the flows and the
layer above hand live objects around through module globals: a module-level container that a
function fills (a table of coordinators by job) is shared by every job of the process."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("boosting", "crypto", "messages", "workers", "flows", "fedboost", "benchmarks")
OURS = {*PACKAGES, "tests"}
ALLOWED = {
    "boosting": {"boosting"},
    "crypto": {"crypto"},
    "messages": {"messages", "boosting"},  # boosting.params alone: see PURE_FROM_BOOSTING
    "workers": {"workers", "boosting", "crypto", "messages"},
    "flows": {"flows", "messages"},
    "fedboost": {"fedboost", "flows", "workers", "boosting", "crypto", "messages"},
    "benchmarks": {"benchmarks", "fedboost", "flows", "workers", "boosting", "crypto", "messages"},
}
PURE_FROM_BOOSTING = {"boosting", "boosting.params"}
"""What ``messages`` may take from ``boosting``: the one declaration of the tree parameters
(bounds, defaults, docstrings), which imports only the standard library and ``boosting``'s
error, so the wire and the flows above it never load the core's numpy."""
FORBIDDEN_THIRD_PARTY = {"flows": {"numpy", "gmpy2", "phe", "numba"}, "workers": {"prefect"}}
KNOWN_CYCLES: dict[str, str] = {}
"""Packages with an import cycle someone is removing (package -> why): an expected failure that
fails (strict) once the cycle is gone, so the entry goes with it."""


def _modules() -> dict[str, Path]:
    """Every module of ours by dotted name (a package by its ``__init__``)."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements anywhere (module level and in functions), except under
    ``if TYPE_CHECKING:``, which never runs."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _import_nodes(child))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _import_nodes(node)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that ``path`` imports (``from a import b`` imports ``a.b`` if it is
    a module, else ``a``)."""
    out = set()
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
        elif node.module and node.level == 0 and node.module.split(".")[0] in OURS:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
    return out & modules.keys()


def import_graph() -> dict[str, list[str]]:
    """Each module of ours -> the modules of ours it imports."""
    modules = _modules()
    return {name: sorted(_imported_modules(path, modules) - {name})
            for name, path in modules.items()}


def import_cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly
    connected components of the import graph, those of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(root: str) -> None:  # iterative: the graph is a few hundred modules deep at most
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    for path in (REPO / package).rglob("*.py"):
        imported = _imports(path)
        ours = imported & OURS
        assert ours <= ALLOWED[package], f"{path.relative_to(REPO)} imports {ours - ALLOWED[package]}"
        banned = imported & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not banned, f"{path.relative_to(REPO)} imports {banned}"


@pytest.mark.parametrize("package", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_CYCLES[p]))
    if p in KNOWN_CYCLES else p for p in PACKAGES])
def test_no_import_cycles(package: str) -> None:
    touching = [c for c in import_cycles(import_graph()) if any(m.split(".")[0] == package for m in c)]
    assert not touching, "import cycles: " + "; ".join(" <-> ".join(c) for c in touching)


def test_the_cycle_finder_sees_late_imports_and_loops() -> None:
    """The detector itself: a function-level import counts, one under ``if TYPE_CHECKING:``
    does not; a loop through three modules is one cycle, a chain is none."""
    late = ast.parse("def f():\n    from workers import checkpoint\n")
    typing_only = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from workers import checkpoint\n")
    assert [n.module for n in _import_nodes(late) if isinstance(n, ast.ImportFrom)] == ["workers"]
    assert [n.module for n in _import_nodes(typing_only)
            if isinstance(n, ast.ImportFrom)] == ["typing"]
    assert import_cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert import_cycles({"a": ["b"], "b": ["c"], "c": []}) == []


FILLED_GLOBALS_BANNED = ("flows", "fedboost")
_MUTATORS = {"append", "add", "extend", "insert", "setdefault", "update", "pop", "popitem",
             "remove", "discard", "clear"}


def filled_globals(tree: ast.Module) -> list[str]:
    """Module-level lists, dicts and sets that a function of the module fills or empties."""
    containers = set()
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.List | ast.Dict | ast.Set) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id in ("list", "dict", "set", "defaultdict")):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    filled = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
                target = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _MUTATORS:
                target = node.func.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id in containers:
                filled.add(target.id)
    return sorted(filled)


@pytest.mark.parametrize("package", FILLED_GLOBALS_BANNED)
def test_no_module_global_is_filled_at_run_time(package: str) -> None:
    for path in (REPO / package).rglob("*.py"):
        filled = filled_globals(ast.parse(path.read_text()))
        assert not filled, (f"{path.relative_to(REPO)}: {', '.join(filled)} filled by its "
                            f"functions; attach per run (a ContextVar) or pass the object")


def test_the_global_finder_sees_a_table_filled_by_a_function() -> None:
    table = ast.parse("_LINKS: dict[str, object] = {}\n"
                      "def attach(c):\n    _LINKS[c.job] = c\n"
                      "def detach(job):\n    _LINKS.pop(job, None)\n")
    constant = ast.parse("NAMES = {'a': 1}\ndef name(k):\n    return NAMES[k]\n")
    assert filled_globals(table) == ["_LINKS"]
    assert filled_globals(constant) == []


MODULE_LINES = 400
"""Past this a module is split by concern, or its docstring says why not: '... stays near N
lines on purpose: ...' (as ``workers.runtime``)."""


def test_a_long_module_says_why_in_its_docstring() -> None:
    unexplained = []
    for name, path in sorted(_modules().items()):
        lines = len(path.read_text().splitlines())
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MODULE_LINES and "lines on purpose" not in docstring:
            unexplained.append(f"{name} ({lines} lines)")
    assert not unexplained, ("split by concern, or say in the docstring why not ('... lines on "
                             "purpose: ...'): " + ", ".join(unexplained))


PROTOCOL_PACKAGES = ("vertical", "forest", "horizontal", "simfl")
"""The protocol packages of ``workers``: each imports protocol-free modules of ``workers``
(runtime, checkpoints, ``column_partitioned``, ``row_partitioned``, ``pairwise_masks``,
``keyed_draws``, ...), never another protocol's package."""
PROTOCOL_REGISTRY = "workers/protocols.py"
"""The one module of ``workers`` outside the protocol packages that imports them: the table of
every protocol's steps a worker serves. Every other is shared, so imports no protocol's package
(code two protocols share is named for what it does: ``workers.column_partitioned`` for the
vertical protocols, ``workers.row_partitioned`` for horizontal and SimFL)."""
KNOWN_CROSS_IMPORTS: dict[str, str] = {}
"""Protocol packages importing another that someone is moving apart (package -> why): an
expected failure that fails (strict) once the import is gone, so the entry goes with it."""


def _protocol_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "workers" and len(parts) > 1 and parts[1] in PROTOCOL_PACKAGES:
        return parts[1]
    return None


def protocol_imports(path: Path, root: Path = REPO) -> list[tuple[str, str]]:
    """(protocol, imported name) for each protocol package's module that ``path`` (a file
    under ``root``) imports: ``import``, ``from ... import`` (also ``from workers import
    vertical``) and relative imports, at module level or in a function."""
    package = list(path.relative_to(root).parent.parts)
    found = []
    for node in _import_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = ([module] if _protocol_of(module) else
                     [f"{module}.{a.name}" for a in node.names] if module == "workers" else [])
        found += [(protocol, name) for name in names if (protocol := _protocol_of(name))]
    return found


def cross_protocol_imports(package: str, root: Path = REPO) -> list[str]:
    """``workers.<package>``'s modules that import another protocol's package, with it."""
    return [f"{path.relative_to(root)} imports {name}"
            for path in sorted((root / "workers" / package).rglob("*.py"))
            for protocol, name in protocol_imports(path, root) if protocol != package]


def shared_protocol_imports(root: Path = REPO) -> list[str]:
    """The modules of ``workers`` outside the protocol packages (but the registry) that import
    a protocol's package, with it."""
    shared = [path for path in sorted((root / "workers").rglob("*.py"))
              if path.relative_to(root / "workers").parts[0] not in PROTOCOL_PACKAGES
              and path.relative_to(root).as_posix() != PROTOCOL_REGISTRY]
    return [f"{path.relative_to(root)} imports {name}"
            for path in shared for _, name in protocol_imports(path, root)]


@pytest.mark.parametrize("package", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=KNOWN_CROSS_IMPORTS[p]))
    if p in KNOWN_CROSS_IMPORTS else p for p in PROTOCOL_PACKAGES])
def test_no_protocol_package_imports_another(package: str) -> None:
    crossing = cross_protocol_imports(package)
    assert not crossing, "; ".join(crossing)


def test_no_shared_module_imports_a_protocol_package() -> None:
    """``workers.column_partitioned``, ``row_partitioned``, ``pairwise_masks``,
    ``keyed_draws``, the runtime, ...: what protocols share depends on none of them."""
    assert (REPO / "workers" / "column_partitioned" / "__init__.py").exists()
    crossing = shared_protocol_imports()
    assert not crossing, "; ".join(crossing)


def test_the_cross_import_finder_sees_another_protocols_package(tmp_path: Path) -> None:
    """The finders themselves, on a tree made here: every way of importing another protocol's
    package is seen (absolute, ``from workers import``, relative, inside a function), a
    protocol's own package and imports under ``if TYPE_CHECKING:`` are not, and a shared
    module is held to importing none."""
    files = {
        "workers/forest/a.py": "from workers.vertical import lookup\nimport workers.simfl.lsh\n",
        "workers/forest/b.py": "def f():\n    from ..vertical.scoring import score_x\n",
        "workers/forest/c.py": "from workers import horizontal, runtime\n",
        "workers/forest/d.py": ("from typing import TYPE_CHECKING\nfrom workers.forest import "
                                "active\nfrom . import trees\nfrom workers.column_partitioned "
                                "import paths\nif TYPE_CHECKING:\n"
                                "    from workers.vertical import active_state\n"),
        "workers/column_partitioned/e.py": "from workers.forest.active import PROTOCOL\n",
        "workers/column_partitioned/f.py": "from workers.column_partitioned import lookup\n",
        "workers/keyed_draws.py": "from .vertical import draws\n",
        "workers/protocols.py": "from workers.vertical.steps import VERTICAL\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cross_protocol_imports("forest", tmp_path) == [
        "workers/forest/a.py imports workers.vertical",
        "workers/forest/a.py imports workers.simfl.lsh",
        "workers/forest/b.py imports workers.vertical.scoring",
        "workers/forest/c.py imports workers.horizontal"]
    assert cross_protocol_imports("vertical", tmp_path) == []
    assert shared_protocol_imports(tmp_path) == [
        "workers/column_partitioned/e.py imports workers.forest.active",
        "workers/keyed_draws.py imports workers.vertical"]


def test_messages_take_only_the_parameters_declaration_from_boosting() -> None:
    modules = _modules()
    for path in (REPO / "messages").rglob("*.py"):
        taken = {m for m in _imported_modules(path, modules) if m.split(".")[0] == "boosting"}
        assert taken <= PURE_FROM_BOOSTING, f"{path.relative_to(REPO)} imports {taken}"
    for name in PURE_FROM_BOOSTING:
        imported = _imports(modules[name])
        assert imported & OURS <= {"boosting"}, f"{name} imports {imported & OURS}"
        third_party = {m for m in imported - OURS
                       if m not in sys.stdlib_module_names and m != "__future__"}
        assert not third_party, f"{name} imports {third_party}: the wire would load it"


def test_the_model_and_run_folders_own_their_file_names() -> None:
    """``workers.model_folder`` names the files of a model part and of a run folder: no other
    module writes one of those names as a literal (a path built from one, rather than from
    ``ModelPart`` or ``RunFolder``, is where a renamed file would be missed)."""
    from workers import model_folder

    names = {value for key, value in vars(model_folder).items()
             if key.isupper() and isinstance(value, str)} | {"report.html"}
    found = []
    for package in ("fedboost", "flows", "workers", "benchmarks"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "workers" / "model_folder.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value!r}")
    assert not found, "take the path from workers.model_folder: " + ", ".join(found)
