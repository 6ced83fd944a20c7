"""Measure the shape of the library: import cycles and private names crossing modules.

Run ``python tools/architecture.py`` from the repository root for the figures;
``tests/core/test_architecture.py`` uses the same functions to keep them at zero.

Definitions (read from the source with ``ast``, nothing is imported):

- An *import edge* goes from a module to the module an ``import`` or
  ``from ... import`` statement (or ``importlib.import_module`` with a
  literal name, counted as function level) loads, wherever it stands: at the
  top, inside a function (``kind="function"``) or under ``if TYPE_CHECKING:``
  (``kind="typing"``, left out of the cycles since it never runs).
  ``from package import name`` points at ``package.name`` when that is a
  module, else at ``package`` (whose ``__init__`` then runs).
- An *import cycle* is a strongly connected group of two or more modules in
  the graph of top-level and function-level edges; ``simple_cycles`` counts
  the distinct loops through them.
- A *private import* is a name starting with one underscore (not a dunder)
  taken from another module: ``from m import _name`` where ``_name`` is not a
  submodule, or a private module ``p._mod`` imported from outside package
  ``p``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autoseq", "autoseq_django", "autoseq_mongoengine")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str  # "top", "function" or "typing"
    line: int


@dataclass(frozen=True)
class PrivateImport:
    importer: str
    name: str  # dotted: module.private_name
    line: int


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return known[name].name == "__init__.py"


def _absolute(module: str, node: ast.ImportFrom, known: dict[str, Path]) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module, known):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST, kind: str = "top") -> Iterator[tuple[ast.stmt, str]]:
    """Every import statement with where it stands."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, kind
        elif isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), "typing")
            for child in node.orelse:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), kind)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(node, "typing" if kind == "typing" else "function")
        else:
            yield from _statements(node, kind)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owner(target: str) -> str:
    """The package a private module belongs to (its parent)."""
    return target.rpartition(".")[0]


def _within(importer: str, package: str) -> bool:
    return importer == package or importer.startswith(package + ".")


def _private_module(target: str) -> str | None:
    """The outermost private package or module on a dotted path, if any."""
    parts = target.split(".")
    for index, part in enumerate(parts):
        if _private(part):
            return ".".join(parts[: index + 1])
    return None


def scan(
    root: Path = ROOT, packages: tuple[str, ...] = PACKAGES
) -> tuple[list[Edge], list[PrivateImport]]:
    known = modules(root, packages)
    edges: list[Edge] = []
    private: list[PrivateImport] = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, kind in _statements(tree):
            for target, name in _targets(module, node, known):
                if target in known and target != module:
                    edges.append(Edge(module, target, kind, node.lineno))
                private.extend(_privates(module, target, name, node.lineno, known))
        for target, line in _dynamic_imports(tree):
            if target in known and target != module:
                edges.append(Edge(module, target, "function", line))
    return edges, private


def _dynamic_imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """``importlib.import_module("literal")`` calls: lazy imports by another name."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


def _targets(
    module: str, node: ast.stmt, known: dict[str, Path]
) -> Iterator[tuple[str, str | None]]:
    """(module loaded, name taken from it or None) for each alias."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
        return
    assert isinstance(node, ast.ImportFrom)
    base = _absolute(module, node, known)
    for alias in node.names:
        child = f"{base}.{alias.name}"
        if child in known:
            yield child, None
        else:
            yield base, alias.name


def _privates(
    importer: str, target: str, name: str | None, line: int, known: dict[str, Path]
) -> Iterator[PrivateImport]:
    if not target.startswith(PACKAGES):
        return
    if name is not None and _private(name) and target != importer:
        yield PrivateImport(importer, f"{target}.{name}", line)
        return
    hidden = _private_module(target)
    if hidden is not None and not _within(importer, _owner(hidden)):
        yield PrivateImport(importer, target, line)


def graph(edges: list[Edge], kinds: tuple[str, ...] = ("top", "function")) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for edge in edges:
        if edge.kind in kinds:
            out.setdefault(edge.source, set()).add(edge.target)
    return out


def cycles(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(adjacency.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(adjacency):
        if node not in index:
            visit(node)
    return sorted(groups)


def simple_cycles(adjacency: dict[str, set[str]], limit: int = 100_000) -> int:
    """How many distinct loops (each counted once, from its smallest module)."""
    count = 0
    for start in sorted(adjacency):
        path = [start]
        seen = {start}

        def walk(
            node: str, start: str = start, path: list[str] = path, seen: set[str] = seen
        ) -> int:
            found = 0
            for nxt in adjacency.get(node, ()):
                if nxt == start:
                    found += 1
                elif nxt > start and nxt not in seen:
                    seen.add(nxt)
                    path.append(nxt)
                    found += walk(nxt)
                    path.pop()
                    seen.discard(nxt)
            return found

        count += walk(start)
        if count >= limit:
            return count
    return count


@dataclass(frozen=True)
class NameCheck:
    module: str
    line: int
    what: str


_PROBED = {"store", "source", "sender"}


def _compares_name(node: ast.Compare) -> str | None:
    for side in (node.left, *node.comparators):
        if (
            isinstance(side, ast.Attribute)
            and side.attr in ("__module__", "__name__")
            and not (isinstance(side.value, ast.Name) and side.value.id == "__name__")
        ):
            return f"compares {side.attr}"
    return None


def _name_check(node: ast.AST) -> str | None:
    """What ``node`` decides about a store by a name, if it does."""
    if isinstance(node, ast.Compare):
        return _compares_name(node)
    if (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "__module__"
    ):
        return "reads __module__"
    if isinstance(node, ast.For) and isinstance(node.iter, ast.Attribute):
        return "walks __mro__ by name" if node.iter.attr == "__mro__" else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in _PROBED
    ):
        return f"{node.func.id}({node.args[0].id}, ...)"
    return None


def name_checks(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[NameCheck]:
    """Capability checks by name: ``__module__``/``__name__`` compared, ``__mro__`` walked
    by class name, ``getattr``/``hasattr`` probes of a store."""
    found = []
    for module, path in modules(root, packages).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            what = _name_check(node)
            if what is not None:
                found.append(NameCheck(module, getattr(node, "lineno", 0), what))
    return sorted(found, key=lambda c: (c.module, c.line))


def loose_files(root: Path = ROOT) -> list[str]:
    return sorted(p.name for p in (root / "autoseq").glob("*.py"))


def report(root: Path = ROOT) -> str:
    edges, private = scan(root)
    runtime = graph(edges)
    groups = cycles(runtime)
    with_typing = cycles(graph(edges, ("top", "function", "typing")))
    top_only = cycles(graph(edges, ("top",)))
    lines = [
        f"import cycles (top + function level): {len(groups)} groups, "
        f"{sum(map(len, groups))} modules, {simple_cycles(runtime)} simple loops",
        f"  top-level only: {len(top_only)} groups; with TYPE_CHECKING: {len(with_typing)} groups",
    ]
    lines += [f"  - {' <-> '.join(group)}" for group in groups]
    lines.append(f"private names imported across modules: {len(private)}")
    lines += [f"  - {p.importer}:{p.line} imports {p.name}" for p in private]
    checks = name_checks(root)
    lines.append(f"capability checks by name: {len(checks)}")
    lines += [f"  - {c.module}:{c.line} {c.what}" for c in checks]
    loose = loose_files(root)
    lines.append(f"files directly in autoseq/: {len(loose)} ({', '.join(loose)})")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
