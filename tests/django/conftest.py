"""Django for the autoseq_django tests only: the rest of the suite never needs it.

Tests take a ``backend`` (sqlite file, postgres, mysql); each gets a
``django_db`` marker for that backend's alias at collection time (with
``transaction=True`` under ``@pytest.mark.autoseq_transaction``, every
database under ``@pytest.mark.autoseq_all_databases``), so only
reachable servers get a test database. An unreachable one skips, or fails
when ``AUTOSEQ_REQUIRE_BACKENDS`` names it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import django
import pytest
from backends import unavailable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_tests.settings")
django.setup()

from django.conf import settings  # noqa: E402

from django_tests.helpers import BACKENDS, COMPANIONS  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "autoseq_transaction: run a backend test as a TransactionTestCase"
    )
    config.addinivalue_line(
        "markers", "autoseq_all_databases: let a backend test query every database"
    )
    config.addinivalue_line(
        "markers", "autoseq_reset_sequences: a TransactionTestCase with reset_sequences=True"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        callspec = getattr(item, "callspec", None)
        if not str(item.path).startswith(here) or callspec is None:
            continue
        backend = callspec.params.get("backend")
        if backend is None or backend not in settings.DATABASES:
            continue
        reset = item.get_closest_marker("autoseq_reset_sequences") is not None
        transaction = reset or item.get_closest_marker("autoseq_transaction") is not None
        # "default" (SQLite in memory) too: admin and auth tables live there;
        # "sqlite" needs its companion set up first.
        databases: Any = sorted({backend, "default", *COMPANIONS.get(backend, ())})
        if item.get_closest_marker("autoseq_all_databases") is not None:
            databases = "__all__"
        item.add_marker(
            pytest.mark.django_db(
                databases=databases, transaction=transaction, reset_sequences=reset
            ),
            append=False,
        )


@pytest.fixture(
    params=[
        pytest.param(name, marks=[getattr(pytest.mark, name)] if name != "sqlite" else [], id=name)
        for name in BACKENDS
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    """Each SQL backend's Django alias in turn (sqlite is a file database)."""
    name = str(request.param)
    if name not in settings.DATABASES:
        unavailable(name, settings.MISSING.get(name, "not configured"))
    return name


@pytest.fixture
def fresh_registries() -> Iterator[None]:
    """Drop every cached registry before and after, as a new process would start."""
    from autoseq_django import registry as sequences

    sequences.reset()
    yield
    sequences.reset()


@pytest.fixture
def reservations() -> Iterator[object]:
    """Reservations made during the test, by sequence name."""
    from autoseq import signals
    from autoseq_django import catchup
    from django_tests.helpers import Reservations

    # Keys an earlier test loaded (its transaction rolled back) are still
    # noted; applying them here keeps their reservations out of the count.
    catchup.flush()
    counter = Reservations()
    signals.block_reserved.connect(counter)
    yield counter
    signals.block_reserved.disconnect(counter)
