"""blinker signals for what operators watch.

Every signal is sent with the [`SequenceLock`][autoseq.lock.SequenceLock] as sender and
keyword arguments that always include ``name`` (the sequence):

``block_reserved``
    a block was reserved: ``first``, ``last``, ``count``, ``latency``
    (seconds), ``prefetch`` (True when reserved in the background).
``prefetch_failed``
    a background reservation failed: ``error``.
``store_unavailable``
    a caller found no buffered value and the store failed: ``error``.
``sequence_exhausted``
    the sequence reached ``end`` without ``cycle``: ``current``, ``end``.
``sequence_cycled``
    a reservation wrapped from ``end`` back to ``start``: ``start``, ``end``.
``low_remaining``
    a non-cycling sequence has reserved past the warning share of its range:
    ``remaining`` (values left), ``used_share`` (0..1).
``store_failover``
    the store now talks to another primary than before (a failover): the
    blocks buffered from the old one were dropped. ``first``: the first
    value of the block reserved on the new one.
``row_went_back``
    a reservation handed out values at or below ones this process had
    already reserved (the store lost writes, as after a failover to a
    lagging replica); they were skipped. ``first``, ``high`` (the highest
    value reserved before).
``block_released``
    ``close()`` handed an unused block back to the store: ``first``, ``count``.
``failover_skipped``
    sent with the store as sender: a connection found a new primary
    (PostgreSQL, its timeline differs from the epoch the rows carry) and
    moved row ``name`` forward past what the lost replication window could
    have handed out, before serving: ``skipped`` (values), ``wanted`` (the
    margin), ``short`` (True when the range had fewer values left than the
    margin: the row now stands at its end), ``primary`` (system identifier,
    timeline) and ``was`` (the recorded one).
"""

from __future__ import annotations

from blinker import Namespace

_signals = Namespace()

block_reserved = _signals.signal("block-reserved", doc="A block of values was reserved.")
prefetch_failed = _signals.signal("prefetch-failed", doc="A background reservation failed.")
store_unavailable = _signals.signal(
    "store-unavailable", doc="The store failed and no buffered value was left."
)
sequence_exhausted = _signals.signal("sequence-exhausted", doc="The sequence reached its end.")
sequence_cycled = _signals.signal("sequence-cycled", doc="The sequence wrapped to its start.")
low_remaining = _signals.signal(
    "low-remaining", doc="A non-cycling sequence passed its warning share."
)
block_released = _signals.signal("block-released", doc="An unused block was handed back.")
store_failover = _signals.signal(
    "store-failover", doc="The store now talks to another primary; buffered blocks were dropped."
)
row_went_back = _signals.signal(
    "row-went-back", doc="A reservation went back below values reserved before; skipped."
)
failover_skipped = _signals.signal(
    "failover-skipped",
    doc="A new primary's treatment moved a row past what a lost replication window served.",
)

__all__ = [
    "block_released",
    "block_reserved",
    "failover_skipped",
    "low_remaining",
    "prefetch_failed",
    "row_went_back",
    "sequence_cycled",
    "sequence_exhausted",
    "store_failover",
    "store_unavailable",
]

# snowflake ids: sent with the Snowflake as sender, ``name`` always included.
snowflake_lifetime_low = _signals.signal(
    "snowflake-lifetime-low",
    doc="A snowflake layout has fewer years of timestamp bits left than its warning "
    "threshold: ``years_left``, ``threshold``.",
)
worker_lease_lost = _signals.signal(
    "worker-lease-lost",
    doc="A snowflake generator lost its worker-id lease: ``worker``, ``reason``.",
)
worker_lease_acquired = _signals.signal(
    "worker-lease-acquired",
    doc="A snowflake generator took a worker-id lease: ``worker``, ``floor_ms``.",
)
__all__ += ["snowflake_lifetime_low", "worker_lease_acquired", "worker_lease_lost"]
