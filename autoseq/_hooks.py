"""Every process-global hook of autoseq's core goes through here: fork and exit.

A module that must act when the process forks or exits calls `on_fork`
or `at_exit` at import time instead of ``os.register_at_fork`` or
``atexit.register``, so this module is the one place that touches process
state, and `REGISTERED` lists what was hooked and why. Each callback
is still registered on its own, so one that raises is reported by the
interpreter and does not stop the others, as before.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable

Hook = Callable[[], None]

#: (when, callback's qualified module.name) for every hook registered, in order.
REGISTERED: list[tuple[str, str]] = []


def _label(hook: Hook) -> str:
    return f"{hook.__module__}.{hook.__qualname__}"


def on_fork(
    *,
    before: Hook | None = None,
    after_in_parent: Hook | None = None,
    after_in_child: Hook | None = None,
) -> None:
    """Run the callbacks around ``os.fork()`` (``before`` in reverse order of registration)."""
    for when, key, hook in (
        ("before fork", "before", before),
        ("after fork in parent", "after_in_parent", after_in_parent),
        ("after fork in child", "after_in_child", after_in_child),
    ):
        if hook is not None:
            REGISTERED.append((when, _label(hook)))
            os.register_at_fork(**{key: hook})


def at_exit(hook: Hook) -> None:
    """Run ``hook`` when the interpreter exits (last registered runs first)."""
    REGISTERED.append(("at exit", _label(hook)))
    atexit.register(hook)
