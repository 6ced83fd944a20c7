"""The tests mirror the packages: the test of a module is found by its path (issue 32).

``tests/`` holds one folder per area and, beside them, only the helpers every
folder shares. The folders named after a library (``sqlalchemy``, ``django``,
``mongoengine``) are not packages: ``tests/`` is on ``sys.path``, so an
``__init__.py`` there would shadow the library itself; pytest imports their
modules by base name, which must then differ across the three.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = {"core", "stores", "sqlalchemy", "django", "mongoengine", "cli", "reliability"}
SHARED = {"conftest.py", "backends.py", "mongo_server.py", "multiprocess_app.py"}
PLAIN = ("sqlalchemy", "django", "mongoengine")


def entries() -> list[Path]:
    """What ``tests/`` holds directly, caches and hidden files aside (a folder left
    with only caches, as a checkout leaves a moved one, is not counted)."""
    return [
        entry
        for entry in TESTS.iterdir()
        if entry.name != "__pycache__"
        and not entry.name.startswith(".")
        and (entry.is_file() or any("__pycache__" not in p.parts for p in entry.rglob("*.py")))
    ]


def test_no_test_file_sits_flat_in_tests() -> None:
    """A test goes in the folder of the package it tests; only shared helpers stay flat."""
    flat = sorted(e.name for e in entries() if e.is_file() and e.name not in SHARED)
    assert flat == [], (
        f"{flat} directly in tests/: move each into tests/<area>/ ({', '.join(sorted(FOLDERS))})"
    )


def test_tests_has_one_folder_per_area() -> None:
    """No folder beside the areas (a new integration adds its folder here and in the docs)."""
    folders = {e.name for e in entries() if e.is_dir()}
    assert folders == FOLDERS


def test_library_named_folders_are_plain_and_their_modules_unique() -> None:
    """``tests/sqlalchemy`` is not a package (it would hide SQLAlchemy), and two of the
    plain folders never hold the same module name (pytest would import only one)."""
    packages = [name for name in PLAIN if (TESTS / name / "__init__.py").exists()]
    assert packages == []
    where: defaultdict[str, list[str]] = defaultdict(list)
    for name in PLAIN:
        for path in (TESTS / name).glob("test_*.py"):
            where[path.name].append(name)
    assert {module: found for module, found in where.items() if len(found) > 1} == {}
