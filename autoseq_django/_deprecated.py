"""Old import paths of this package, kept for one release with a ``DeprecationWarning``.

The mechanism of the core's ``autoseq._deprecated`` (private to ``autoseq``: an
integration imports only the core's public names): the old module's
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
