"""Deprecated: the snowflake subcommands moved to :mod:`autoseq.cli.snowflake`.

Importing a name from here still works for one release, with a
``DeprecationWarning``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(
        "autoseq.snowflake_cli moved to autoseq.cli.snowflake; the old module goes in the "
        "next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module("autoseq.cli.snowflake"), name)
