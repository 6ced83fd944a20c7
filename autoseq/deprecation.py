"""Old import paths kept for one release after a move, with a ``DeprecationWarning``.

Public so that the integrations (`autoseq_django`, `autoseq_mongoengine`)
keep their own old paths with the same mechanism: an old module's
``__getattr__`` gives each name of the new module, with a warning.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved(old: str, new: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old``: each name is ``new``'s, with a warning."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old} moved to {new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new), name)

    return __getattr__
