"""autoseq: ordered integer keys from a ``sys_sequence`` table, served in blocks.

The core imports only the standard library and blinker; stores and ORM
integrations import their drivers when used.
"""

from __future__ import annotations

from autoseq import signals
from autoseq.config import MAX_VALUE, SequenceConfig
from autoseq.errors import (
    AutoseqError,
    GaplessUnavailable,  # serials (issue 14)
    InvalidSequenceConfig,
    ReservationConflict,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
    UnsupportedInsert,
)
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import SequenceRegistry
from autoseq.serial import InvalidSerial, Serial  # serials (issue 14)
from autoseq.stores.base import Block, SequenceStore

__version__ = "0.1.0"

__all__ = [
    "MAX_VALUE",
    "AutoseqError",
    "Block",
    "BufferPolicy",
    "InvalidSequenceConfig",
    "ReservationConflict",
    "SequenceConfig",
    "SequenceExhausted",
    "SequenceLock",
    "SequenceNotFound",
    "SequenceRegistry",
    "SequenceStore",
    "StoreUnavailable",
    "UnsupportedInsert",
    "signals",
]
__all__ += ["GaplessUnavailable", "InvalidSerial", "Serial"]
