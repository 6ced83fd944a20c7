"""autoseq for mongoengine: ``SequenceField``, batched from a ``sys_sequence`` collection.

A drop-in for mongoengine's own ``SequenceField`` (same arguments, plus the
sequence settings): values come in blocks, are assigned when a document is
saved or inserted (never when the attribute is read), and a bulk insert of N
documents costs about N / block round trips. ``adopt`` starts a sequence
where mongoengine's counter or the existing documents left off.

Names are imported on first access, so the ``autoseq`` command can load
`autoseq_mongoengine.cli` without importing mongoengine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoseq_mongoengine.adoption import Adoption, adopt, adopt_sequence
    from autoseq_mongoengine.fields import SequenceField
    from autoseq_mongoengine.registry import sequences
    from autoseq_mongoengine.serials import SerialField
    from autoseq_mongoengine.snowflake import SnowflakeField

_LAZY = {
    "Adoption": "autoseq_mongoengine.adoption",
    "adopt": "autoseq_mongoengine.adoption",
    "adopt_sequence": "autoseq_mongoengine.adoption",
    "SequenceField": "autoseq_mongoengine.fields",
    "sequences": "autoseq_mongoengine.registry",
    "SerialField": "autoseq_mongoengine.serials",  # issue 14
    "SnowflakeField": "autoseq_mongoengine.snowflake",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autoseq_mongoengine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Adoption",
    "SequenceField",
    "SerialField",
    "SnowflakeField",
    "adopt",
    "adopt_sequence",
    "sequences",
]
