"""Security: names and values travel as data, never pasted into SQL text or MongoDB keys.

Every statement (SQLAlchemy's ``before_cursor_execute``) or command
(pymongo's command monitoring) a store sends while serving a hostile name is
recorded: the name and the values appear only among the bound parameters
(SQL) or as plain string values of ``_id`` (MongoDB), and the hostile row
round-trips while a bystander row and the table stay untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from autoseq import SequenceConfig

from .harness import TALLIES

HOSTILE = [
    "x'); DROP TABLE sys_sequence; --",
    '{"$gt": ""}',
    "$where: function() { return true }",
    "a.b.$[].c",
    "'; UPDATE sys_sequence SET current = 1 WHERE '1'='1",
    "\\'; SELECT pg_sleep(10); --",
    "name` OR 1=1 #",
    "$" * 191,
]
#: A start no statement text could contain by chance: it must travel as a parameter.
START = 7_777_777_777


def exercise(store: Any, name: str) -> list[int]:
    """Every store method on ``name``, as an application would call them."""
    store.create(SequenceConfig("bystander"))
    row = store.create(SequenceConfig(name, start=START, step=3))
    first = store.reserve(name, 4)
    store.read(name)
    store.update(row.replace(current=first.last + 3, end=START + 10_000))
    second = store.reserve(name, 2)
    store.release(second)
    store.read_all()
    return [*first.values(), *second.values()]


def walk(document: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted key path, leaf value) of a BSON-like document."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(document, (list, tuple)):
        for value in document:
            yield from walk(value, f"{path}[]")
    else:
        yield path, document


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_names_travel_as_data(target: Any, name: str) -> None:
    """A name full of SQL and $ operators is a parameter or a value, never code."""
    with target.recording() as (store, sent):
        values = exercise(store, name)
    assert values == [START + 3 * i for i in range(6)]
    rows = {row["name"]: row for row in target.rows()}
    assert set(rows) == {"bystander", name}
    assert rows["bystander"]["current"] == 1
    assert rows[name]["current"] == START + 12  # the released block went back
    assert sent, "nothing was recorded"
    if target.kind == "sql":
        for statement, _parameters in sent:
            assert name not in statement, f"name pasted into SQL: {statement}"
            assert str(START) not in statement, f"value pasted into SQL: {statement}"
        bound = [p for _, p in sent if name in str(p)]
        assert len(bound) >= 5, "the name should travel as a bound parameter"
    elif target.kind == "redis":
        keys = [a for _, args in sent for a in args if str(a).startswith(f"{{{target.prefix}")]
        assert keys, "no key was recorded"
        assert not any(name in str(key) for key in keys), "the raw name reached a Redis key"
        for command_name, args in sent:
            assert name not in command_name
            if command_name.upper() in ("EVAL", "SCRIPT LOAD", "SCRIPT"):
                assert not any(name in str(a) for a in args), "the name reached a Lua script"
        assert any(a == name for _, args in sent for a in args), "name never sent as data"
    else:
        for command_name, command in sent:
            for path, leaf in walk(dict(command)):
                assert name not in path, f"name used as a key in {command_name}: {path}"
                if leaf == name:
                    assert path.endswith("._id"), f"name outside _id in {command_name}: {path}"
            assert not any(
                isinstance(leaf, str) and name in leaf and leaf != name
                for _, leaf in walk(dict(command))
            ), f"name spliced into a string in {command_name}"
    TALLIES.append({"store": target.id, "scenario": "security", "statements": len(sent)})
