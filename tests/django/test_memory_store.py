"""The private in-memory store behind in-memory SQLite test databases, under threads."""

from __future__ import annotations

import threading

import pytest

from autoseq import SequenceConfig
from autoseq.stores import SQLStore
from autoseq_django import registry as sequences


def hammer(store: SQLStore) -> tuple[list[str], list[int]]:
    """Four threads reserving and creating rows at once; errors and values seen."""
    store.create_table()
    for name in "abcd":
        store.create(SequenceConfig(f"mem_{name}"))
    errors: list[str] = []
    values: list[int] = []
    guard = threading.Lock()

    def work(name: str) -> None:
        try:
            for i in range(150):
                block = store.reserve("mem_a" if i % 2 else f"mem_{name}", 3)
                store.create(SequenceConfig(f"mem_{name}_{i}"))
                if block.name == "mem_a":
                    with guard:
                        values.extend(block.values())
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(name,)) for name in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors, values


@pytest.mark.django_db(transaction=True)
def test_django_in_memory_store_serves_threads() -> None:
    """The store behind the in-memory test database survives concurrent threads."""
    sql_store = sequences.store("default")
    # In memory, shared-cache, named after the test database (its connections attach it).
    assert sql_store.url.query["mode"] == "memory"
    assert sql_store.url.database == "file:memorydb_default.autoseq"
    errors, values = hammer(sql_store)
    assert errors == []
    assert len(values) == len(set(values)) == (4 * 75 + 75) * 3  # odd i, and all of "a"


def test_core_private_memory_store_serves_threads() -> None:
    """SQLStore('sqlite://') itself, used by several threads at once."""
    errors, values = hammer(SQLStore("sqlite://"))
    assert errors == []
    assert len(values) == len(set(values)) == (4 * 75 + 75) * 3
