"""django-sequences' own test suite, run against autoseq_django's functions.

The upstream tests are not vendored. ``AUTOSEQ_DJANGO_SEQUENCES_REPO`` names
a git clone of aaugustin/django-sequences (its ``tests/`` at ``HEAD``, or at
``AUTOSEQ_DJANGO_SEQUENCES_REF``); the sdist on PyPI carries no tests.
Without it this module skips (``make upstream-django-sequences`` sets it).

Their ``tests/test_sequences.py`` runs unchanged under Django's own runner
in a subprocess: a module named ``sequences`` on the path re-exports ours,
so their ``from sequences import ...`` gets autoseq_django's API, and
``INSTALLED_APPS`` is ``autoseq_django`` instead of ``sequences``. Twice:

- ``autoseq_django.django_sequences`` (gapless, django-sequences' semantics):
  every test passes;
- ``autoseq_django`` itself (values from blocks): the tests that read
  django-sequences' gapless behaviour fail by design, as listed.

The lists and their reasons are the table in docs/django.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from backends import POSTGRES_URL, _sql_problem, unavailable

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_FILES = ("tests/__init__.py", "tests/test_sequences.py")
SHIMS = {
    "gapless": "from autoseq_django.django_sequences import *  # noqa: F403\n",
    "blocks": (
        "from autoseq_django import Sequence, delete, get_last_value, get_next_value, "
        "get_next_values\n"
    ),
}
IN_TRANSACTION = "SingleConnectionInTransactionTests"
AUTOCOMMIT = "SingleConnectionInAutocommitTests"
BLOCK_TOP = "get_last_value() from blocks is the top of the reserved block (100), not 1"
BLOCKS_KEEP_ROWS = (
    "a block is reserved in autoseq's own transaction, which the test's rollback does "
    "not undo: a later test's sequence of the same name continues"
)
NO_ROW_LOCK = "values from blocks take no lock the caller holds: the second thread never waits"
#: Upstream tests that fail, by (shim, backend), and why: the table in docs/django.md.
EXPECTED_FAILURES: dict[tuple[str, str], dict[str, str]] = {
    ("gapless", "sqlite"): {},
    ("gapless", "postgres"): {},
}
_BLOCKS = {
    **{
        f"{case}.{test}": BLOCK_TOP
        for case in (IN_TRANSACTION, AUTOCOMMIT)
        for test in (
            "test_functions_defaults",
            "test_class_defaults",
            "test_functions_sequence_name",
            "test_class_sequence_name",
        )
    },
    **{
        f"{IN_TRANSACTION}.{test}": BLOCKS_KEEP_ROWS
        for test in (
            "test_class_iter",
            "test_class_next",
            "test_class_reset_value",
            "test_functions_batch",
            "test_functions_initial_value",
            "test_functions_reset_value",
        )
    },
}
EXPECTED_FAILURES["blocks", "sqlite"] = {
    **_BLOCKS,
    # The first TransactionTestCase after the TestCases (SQLite skips ConcurrencyTests).
    f"{AUTOCOMMIT}.test_class_batch": BLOCKS_KEEP_ROWS,
}
EXPECTED_FAILURES["blocks", "postgres"] = {
    **_BLOCKS,
    **{
        f"ConcurrencyTests.{test}": NO_ROW_LOCK
        for test in (
            "test_first_access_with_commit",
            "test_later_access_with_commit",
            "test_first_access_nowait",
            "test_later_access_nowait",
        )
    },
    **{
        f"ConcurrencyTests.{test}": "a rollback does not give a block's value back"
        for test in ("test_first_access_with_rollback", "test_later_access_with_rollback")
    },
}
RESULT = re.compile(r"^(test_\w+) \(tests\.test_sequences\.(\w+)\.\w+\)\s*\.\.\.\s*(\w+)", re.M)


def upstream_source(relative: str) -> str | None:
    """``relative`` in the django-sequences clone named by the environment, if any."""
    repo = os.environ.get("AUTOSEQ_DJANGO_SEQUENCES_REPO")
    if not repo:
        return None
    git = ["git", "--git-dir", repo] if Path(repo, "HEAD").exists() else ["git", "-C", repo]
    ref = os.environ.get("AUTOSEQ_DJANGO_SEQUENCES_REF", "HEAD")
    shown = subprocess.run(
        [*git, "show", f"{ref}:{relative}"], capture_output=True, text=True, check=False
    )
    return shown.stdout if shown.returncode == 0 else None


def settings_for(backend: str) -> str:
    """The settings module of the run: one database, ``default``, on ``backend``."""
    common = (
        'INSTALLED_APPS = ["autoseq_django"]\nSECRET_KEY = "upstream"\nUSE_TZ = True\n'
        'DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"\n'
    )
    if backend == "sqlite":
        return common + 'DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3"}}\n'
    from sqlalchemy.engine import make_url

    url = make_url(POSTGRES_URL)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "NAME": url.database,
        "TEST": {"NAME": f"test_autoseq_djseq_{uuid.uuid4().hex[:10]}"},
    }
    return common + f"DATABASES = {{'default': {database!r}}}\n"


def run_upstream(tmp_path: Path, shim: str, backend: str) -> dict[str, str]:
    """Run their suite with ``shim`` as ``sequences`` on ``backend``: outcome by Case.test."""
    for relative in UPSTREAM_FILES:
        source = upstream_source(relative)
        if source is None and os.environ.get("AUTOSEQ_DJANGO_SEQUENCES_REPO"):
            pytest.fail(f"{relative} not in AUTOSEQ_DJANGO_SEQUENCES_REPO's clone")
        if source is None:
            pytest.skip(
                f"django-sequences' {relative} not found: set AUTOSEQ_DJANGO_SEQUENCES_REPO "
                "to a clone of aaugustin/django-sequences (make upstream-django-sequences)"
            )
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source)
    (tmp_path / "sequences").mkdir()
    (tmp_path / "sequences" / "__init__.py").write_text(SHIMS[shim])
    (tmp_path / "upstream_settings.py").write_text(settings_for(backend))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    command = [sys.executable, "-m", "django", "test", "tests.test_sequences", "-v", "2"]
    done = subprocess.run(
        [*command, "--settings", "upstream_settings", "--noinput"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcomes = {f"{case}.{test}": word for test, case, word in RESULT.findall(done.stderr)}
    assert outcomes, done.stderr[-3000:]
    return outcomes


@pytest.mark.parametrize("shim", ["gapless", "blocks"])
@pytest.mark.parametrize(
    "backend", [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_django_sequences_suite(tmp_path: Path, shim: str, backend: str) -> None:
    """Their 36 tests: exactly the listed ones fail (skipped ones are SQLite's own skips)."""
    if backend == "postgres":
        problem = _sql_problem(POSTGRES_URL)
        if problem:
            unavailable("postgres", problem)
    outcomes = run_upstream(tmp_path, shim, backend)
    counts = {word: list(outcomes.values()).count(word) for word in set(outcomes.values())}
    print(f"django-sequences' suite, {shim} on {backend}: {counts}")
    failed = {name for name, word in outcomes.items() if word in ("FAIL", "ERROR")}
    assert failed == set(EXPECTED_FAILURES[shim, backend])
    assert len(outcomes) == 36
