"""Each integration's uses of its ORM's private internals live in its _compat module."""

from __future__ import annotations

import pathlib
import re

import pytest

import autoseq_django
import autoseq_mongoengine

PRIVATE = {
    autoseq_mongoengine: re.compile(
        r"\._data\b|\._mark_as_changed\b|\._get_collection(_name)?\b|\._class_name\b"
        r"|\._meta\b|\"_fields\"|\._fields\b|\"_created\"|\"_initialised\"|\"_changed_fields\""
    ),
    autoseq_django: re.compile(
        r"\b_reset_sequences\s*=|\.run_on_commit\b|backends\.base\.base import NO_DB_ALIAS"
        r"|getattr\(\w+, \"objs\""
    ),
}


@pytest.mark.parametrize("package", list(PRIVATE), ids=lambda p: p.__name__)
def test_private_internals_are_reached_only_from_compat(package: object) -> None:
    """No module but _compat.py touches the ORM internals _compat wraps."""
    root = pathlib.Path(package.__file__).parent  # type: ignore[attr-defined]
    pattern = PRIVATE[package]  # type: ignore[index]
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.name != "_compat.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
