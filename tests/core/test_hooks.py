"""Process-global hooks of the core all go through autoseq._hooks, in one place."""

from __future__ import annotations

import pathlib
import re

import autoseq
import autoseq.snowflake
import autoseq.stores.sql
from autoseq import _hooks

CORE = pathlib.Path(autoseq.__file__).parent


def test_only_the_hooks_module_registers_fork_and_exit_hooks_in_the_core() -> None:
    """No core module but _hooks calls os.register_at_fork or atexit.register itself."""
    direct = re.compile(r"\bos\.register_at_fork\(|\batexit\.register\(")
    offenders = [
        str(path.relative_to(CORE))
        for path in CORE.rglob("*.py")
        if path.name != "_hooks.py" and direct.search(path.read_text())
    ]
    assert offenders == []


def test_the_registry_lists_every_core_hook() -> None:
    """REGISTERED names each fork and exit hook of the lock, stores and snowflake."""
    names = {label for _, label in _hooks.REGISTERED}
    assert {
        "autoseq.lock._after_fork_in_child",
        "autoseq.lock._close_all_at_exit",
        "autoseq.stores.base._after_fork_in_child",
        "autoseq.stores.sql._close_gates_before_fork",
        "autoseq.snowflake._close_all",
    } <= names
    assert ("before fork", "autoseq.stores.sql._close_gates_before_fork") in _hooks.REGISTERED
