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
SEQUENCE_TESTS = "tests/fields/test_sequence_field.py"  # in the repository, not the sdist
SIGNAL_TESTS = "tests/test_signals.py"  # in both

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


def upstream_source(relative: str) -> str | None:
    """``relative`` (a path in mongoengine's repository) at the installed release, if reachable."""
    path = os.environ.get("AUTOSEQ_MONGOENGINE_TESTS")
    if path and relative == SEQUENCE_TESTS:
        return Path(path).read_text()
    in_sdist = Path(os.environ.get("AUTOSEQ_MONGOENGINE_SDIST") or "/nonexistent", relative)
    if in_sdist.exists():
        return in_sdist.read_text()
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
        [*git, "show", f"{tag}:{relative}"],
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


def load_case(
    source: str,
    without_counters: bool,
    case: str = "TestSequenceField",
    bound: dict[str, Any] | None = None,
) -> type[unittest.TestCase]:
    """The upstream TestCase class ``case``, its module's names bound to autoseq's field."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    if without_counters:
        tree = _WithoutCounters().visit(tree)
    names: dict[str, Any] = {
        name: getattr(mongoengine, name) for name in getattr(mongoengine, "__all__", ())
    }
    names["signals"] = mongoengine.signals
    names["SequenceField"] = SequenceField
    names["MongoDBTestCase"] = unittest.TestCase
    names["unittest"] = unittest
    names.update(bound or {})
    exec(compile(ast.fix_missing_locations(tree), f"upstream_{case}.py", "exec"), names)
    return names[case]  # type: ignore[no-any-return]


SOURCE = upstream_source(SEQUENCE_TESTS)
SIGNALS_SOURCE = upstream_source(SIGNAL_TESTS)
TESTS = (
    sorted(FAIL_AS_WRITTEN)
    if SOURCE is None
    else sorted(name for name in vars(load_case(SOURCE, False)) if name.startswith("test_"))
)


def run_upstream(me_db: Any, name: str, without_counters: bool) -> None:
    if SOURCE is None:
        pytest.skip(
            "set AUTOSEQ_MONGOENGINE_REPO (a clone: the sdist ships no tests/fields) "
            "or AUTOSEQ_MONGOENGINE_TESTS to run these"
        )
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


def server_bound(me_db: Any) -> dict[str, Any]:
    """``connect`` and ``register_connection`` as upstream calls them, kept on the test server."""
    host, port = me_db.client.address

    def connect(*_args: Any, **_kwargs: Any) -> Any:
        return me_db.client  # the fixture's default connection stands

    def register_connection(alias: str, db: str | None = None, **_kwargs: Any) -> None:
        mongoengine.register_connection(
            alias, db=f"{me_db.name}_{db}", host=f"mongodb://{host}:{port}"
        )

    return {"connect": connect, "register_connection": register_connection}


def test_upstream_signals_pass_with_autoseqs_field(
    me_db: Any, request: pytest.FixtureRequest
) -> None:
    """mongoengine's test_signals, every case in one database as upstream runs them, passes.

    Its ``Author`` is keyed by a ``SequenceField``; each setUp resets it with
    ``drop_collection()`` then ``set_next_value(0)`` and expects ids from 1.
    """
    if SIGNALS_SOURCE is None:
        pytest.skip("set AUTOSEQ_MONGOENGINE_SDIST or AUTOSEQ_MONGOENGINE_REPO to run these")
    if request.node.callspec.params.get("me_db") == "mongomock":
        pytest.skip("switch_db needs a second connection to a real server")
    case = load_case(SIGNALS_SOURCE, False, "TestSignal", server_bound(me_db))
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
    try:
        result = unittest.TestResult()
        suite.run(result)
    finally:
        mongoengine.disconnect("testdb-1")
    problems = [f"{test.id()}: {trace.splitlines()[-1]}" for test, trace in result.failures]
    problems += [f"{test.id()}: {trace.splitlines()[-1]}" for test, trace in result.errors]
    assert result.testsRun >= 7
    assert not problems, problems
