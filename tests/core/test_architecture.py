"""The house stays in order: no import cycle and no private name across modules.

Figures come from ``tools/architecture.py`` (read with ``ast``: imports at the
top, inside functions and ``importlib.import_module("literal")``; the
``TYPE_CHECKING`` block never runs and is left out). What is allowed is listed
here, each with its reason; the lists only ever shrink.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import architecture  # noqa: E402

#: Import cycles still standing, each with why; the lists shrink, never grow.
ALLOWED_CYCLES: dict[frozenset[str], str] = {
    frozenset({"autoseq.doctor", "autoseq.cli.doctor"}): (
        "deprecation shim: autoseq.doctor.run_cli/configure_cli/HELP resolve lazily to "
        "autoseq.cli.doctor for one release"
    ),
}

#: Private names imported across modules still standing, with why.
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {}

#: Old module paths that are deprecation shims now, and where their names went.
MOVED = {
    "autoseq.gapless": "autoseq.stores.sql.gapless",
    "autoseq.gapless_mongo": "autoseq.stores.mongo.gapless",
    "autoseq.workers.sql": "autoseq.stores.sql.workers",
    "autoseq.workers.mongo": "autoseq.stores.mongo.workers",
    "autoseq.workers.redis": "autoseq.stores.redis.workers",
    "autoseq.snowflake_cli": "autoseq.cli.snowflake",
    "autoseq.serial_sqlalchemy": "autoseq.sqlalchemy",
    "autoseq.alembic": "autoseq.sqlalchemy.alembic",
    "autoseq_django.snowflake_fields": "autoseq_django.snowflake",
    "autoseq_django.sequences": "autoseq_django.registry",
}


def _scan() -> tuple[list[architecture.Edge], list[architecture.PrivateImport]]:
    return architecture.scan(ROOT)


def test_no_new_import_cycle() -> None:
    edges, _ = _scan()
    found = {frozenset(group) for group in architecture.cycles(architecture.graph(edges))}
    new = [sorted(group) for group in found - set(ALLOWED_CYCLES)]
    assert not new, f"import cycles came back: {new}"


def test_the_allowed_cycles_still_exist() -> None:
    """An allowance whose cycle is gone is deleted, so the list only shrinks."""
    edges, _ = _scan()
    found = {frozenset(group) for group in architecture.cycles(architecture.graph(edges))}
    gone = [sorted(group) for group in set(ALLOWED_CYCLES) - found]
    assert not gone, f"these cycles are gone: delete them from ALLOWED_CYCLES: {gone}"


def test_no_new_private_import_across_modules() -> None:
    _, private = _scan()
    found = {(p.importer, p.name) for p in private}
    new = sorted(found - set(ALLOWED_PRIVATE))
    assert not new, f"private names imported across modules: {new}"
    gone = sorted(set(ALLOWED_PRIVATE) - found)
    assert not gone, f"gone: delete them from ALLOWED_PRIVATE: {gone}"


def test_no_capability_is_checked_by_name_in_the_core() -> None:
    checks = [
        c
        for c in architecture.name_checks(ROOT)
        if c.module.startswith("autoseq.")
        and (c.module, c.what)
        not in {
            # not a capability: the most derived installed Session class wins, which
            # only the MRO's order decides (two unrelated installed bases of one class)
            ("autoseq.sqlalchemy.registries", "walks __mro__ by name"),
        }
    ]
    assert not checks, f"capabilities checked by name: {checks}"


def test_the_library_never_imports_the_command_line() -> None:
    edges, _ = _scan()
    library = [
        e
        for e in edges
        if e.target.startswith("autoseq.cli")
        and e.source.startswith("autoseq.")
        and not e.source.startswith("autoseq.cli")
        and e.source not in MOVED
        and e.source != "autoseq.__main__"  # `python -m autoseq`: an entry point
        # doctor's deprecation shim for run_cli/configure_cli/HELP, see ALLOWED_CYCLES
        and (e.source, e.target) != ("autoseq.doctor", "autoseq.cli.doctor")
    ]
    assert not library, f"the library imports the CLI: {library}"


def test_the_tools_own_figures_are_sound(tmp_path: Path) -> None:
    """A cycle through a function-level import and a private import are both seen."""
    package = tmp_path / "autoseq"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from autoseq.b import _hidden\n")
    (package / "b.py").write_text("def f():\n    from autoseq import a\n_hidden = 1\n")
    edges, private = architecture.scan(tmp_path, ("autoseq",))
    assert architecture.cycles(architecture.graph(edges)) == [["autoseq.a", "autoseq.b"]]
    assert [(p.importer, p.name) for p in private] == [("autoseq.a", "autoseq.b._hidden")]
    assert architecture.cycles(architecture.graph(edges, ("top",))) == []


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_still_answers_with_a_warning(old: str, new: str) -> None:
    target = importlib.import_module(new)
    name = next(n for n in vars(target) if not n.startswith("_") and n != "annotations")
    shim = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(shim, name)
    assert value is getattr(target, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module(new)  # the new path itself is quiet


@pytest.mark.parametrize("module", ["autoseq", "autoseq.cli"])
def test_python_dash_m_runs_the_command_line(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: autoseq" in done.stdout
    assert "doctor" in done.stdout
    assert "workers" in done.stdout
