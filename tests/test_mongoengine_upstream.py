"""mongoengine's own SequenceField tests, run with autoseq's field swapped in.

The upstream file is not vendored. Point ``AUTOSEQ_MONGOENGINE_TESTS`` at a
copy of ``tests/fields/test_sequence_field.py``, or ``AUTOSEQ_MONGOENGINE_REPO``
at a git clone of MongoEngine/mongoengine (the tag of the installed release is
read from it); otherwise this module skips.

Each upstream test runs twice: as written, where the tests that read the
builtin's ``mongoengine.counters`` documents fail by design (autoseq's rows
live in ``sys_sequence``, in blocks: docs/mongoengine.md), and with every
statement that reads ``mongoengine.counters`` taken out, where everything
else must pass. The expected outcomes are the table in docs/mongoengine.md.
"""

from __future__ import annotations

import ast
import os
import subprocess
import unittest
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mongoengine
import pytest
from mongo_server import ME_SERVERS, me_db_on

from autoseq_mongoengine import SequenceField

pytestmark = [pytest.mark.mongodb]


@pytest.fixture(params=ME_SERVERS)
def me_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each test on secantusdb, then on mongomock (tests needing a real server skip there)."""
    yield from me_db_on(request)


COUNTERS = "mongoengine.counters"

#: Upstream tests that fail as written, and why (each reads the builtin's layout).
FAIL_AS_WRITTEN = {
    "test_sequence_field": "reads mongoengine.counters",
    "test_sequence_field_get_next_value": "resets the builtin by dropping mongoengine.counters",
    "test_sequence_field_sequence_name": "reads mongoengine.counters",
    "test_multiple_sequence_fields": "reads mongoengine.counters",
    "test_multiple_sequence_fields_on_docs": "reads mongoengine.counters",
    "test_sequence_field_value_decorator": "reads mongoengine.counters",
    "test_embedded_sequence_field": "reads mongoengine.counters",
    "test_inherited_sequencefield": "reads mongoengine.counters",
    "test_no_inherited_sequencefield": "reads mongoengine.counters",
    "test_sequence_setattr_not_incrementing_counter": "reads mongoengine.counters",
}
#: Upstream tests that still fail with the mongoengine.counters reads taken out.
FAIL_WITHOUT_COUNTERS = {
    "test_sequence_field_get_next_value": (
        "dropping mongoengine.counters is how it resets the sequence to 1; "
        "autoseq's row is in sys_sequence and the process keeps its buffered block"
    ),
}


def upstream_source() -> str | None:
    path = os.environ.get("AUTOSEQ_MONGOENGINE_TESTS")
    if path:
        return Path(path).read_text()
    repo = os.environ.get("AUTOSEQ_MONGOENGINE_REPO")
    if not repo:
        return None
    tag = f"v{mongoengine.__version__}"
    git = (
        ["git", "--git-dir", repo]
        if repo.endswith(".git") or Path(repo, "HEAD").exists()
        else (["git", "-C", repo])
    )
    shown = subprocess.run(
        [*git, "show", f"{tag}:tests/fields/test_sequence_field.py"],
        capture_output=True,
        text=True,
        check=False,
    )
    return shown.stdout if shown.returncode == 0 else None


class _WithoutCounters(ast.NodeTransformer):
    """Drops every statement that mentions mongoengine.counters or a value read from it."""

    def __init__(self) -> None:
        self.tainted: set[str] = set()

    def _drops(self, node: ast.stmt) -> bool:
        if not isinstance(node, (ast.Assign, ast.Assert, ast.Expr)):
            return False  # a class, a function, a loop: look inside instead
        text = ast.unparse(node)
        if COUNTERS in text:
            if isinstance(node, ast.Assign):
                self.tainted.update(t.id for t in node.targets if isinstance(t, ast.Name))
            return not text.endswith(".drop()")  # dropping it is harmless
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return isinstance(node, ast.Assert) and bool(names & self.tainted)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                kept = [self.visit(s) for s in value if not self._drops(s)]
                setattr(node, field, kept or [ast.Pass()])
            elif isinstance(value, ast.AST):
                self.visit(value)
        return node


def load_case(source: str, without_counters: bool) -> type[unittest.TestCase]:
    """The upstream TestCase class, its module's names bound to autoseq's field."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    if without_counters:
        tree = _WithoutCounters().visit(tree)
    names: dict[str, Any] = {
        name: getattr(mongoengine, name) for name in getattr(mongoengine, "__all__", ())
    }
    names["SequenceField"] = SequenceField
    names["MongoDBTestCase"] = unittest.TestCase
    exec(compile(ast.fix_missing_locations(tree), "upstream_test_sequence_field.py", "exec"), names)
    return names["TestSequenceField"]  # type: ignore[no-any-return]


SOURCE = upstream_source()
TESTS = (
    sorted(FAIL_AS_WRITTEN)
    if SOURCE is None
    else sorted(name for name in vars(load_case(SOURCE, False)) if name.startswith("test_"))
)


def run_upstream(me_db: Any, name: str, without_counters: bool) -> None:
    if SOURCE is None:
        pytest.skip("set AUTOSEQ_MONGOENGINE_TESTS or AUTOSEQ_MONGOENGINE_REPO to run these")
    case = load_case(SOURCE, without_counters)(name)
    case.db = me_db  # type: ignore[attr-defined]
    getattr(case, name)()


@pytest.mark.parametrize("name", TESTS)
def test_upstream_as_written(me_db: Any, name: str) -> None:
    """Upstream's test as written: only those reading the builtin's counters fail."""
    if name in FAIL_AS_WRITTEN:
        with pytest.raises((AssertionError, TypeError)):
            run_upstream(me_db, name, without_counters=False)
    else:
        run_upstream(me_db, name, without_counters=False)


@pytest.mark.parametrize("name", TESTS)
def test_upstream_without_counter_reads(me_db: Any, name: str) -> None:
    """Upstream's test minus its mongoengine.counters reads passes, but for the listed two."""
    if name in FAIL_WITHOUT_COUNTERS:
        with pytest.raises(AssertionError):
            run_upstream(me_db, name, without_counters=True)
    else:
        run_upstream(me_db, name, without_counters=True)
