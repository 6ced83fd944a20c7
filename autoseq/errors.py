"""The exceptions autoseq raises; every one is an [`AutoseqError`][autoseq.errors.AutoseqError].

One exception here is not: `Conflict`, the SQL store's internal "try again",
which never leaves the store.
"""

from __future__ import annotations


class AutoseqError(Exception):
    """Base class of every error autoseq raises on purpose."""


class InvalidSequenceConfig(AutoseqError, ValueError):
    """A sequence's settings (or a stored row) cannot produce valid values.

    Raised by ``SequenceConfig``, ``setting`` names the setting at fault
    (``"step"``) and ``rule`` the rule it breaks: ``"type"``, ``"size"``
    (outside 64 bits), ``"minimum"``, ``"order"`` (``start`` above ``end``),
    ``"room"``, ``"range"`` or ``"grid"`` (``current``); both are None
    elsewhere. Integrations map them to their own codes (Django's checks).
    """

    def __init__(self, *args: object, setting: str | None = None, rule: str | None = None) -> None:
        super().__init__(*args)
        self.setting = setting
        self.rule = rule


class MissingDriver(InvalidSequenceConfig):
    """The sync driver the store needs for a database URL is not installed.

    Also importable from `autoseq.stores.sql` (its home before 0.x).
    """


class InvalidStoredRow(InvalidSequenceConfig):
    """A stored ``sys_sequence`` row holds what no valid sequence can (a hand edit, say).

    Nothing is written while a row is in this state; the message names the
    row and the command that repairs it.
    """

    def __init__(self, name: object, problem: str) -> None:
        self.name = name
        super().__init__(
            f"stored sys_sequence row {name!r} is invalid: {problem}; nothing was written. "
            f"Repair it with `autoseq set {name} VALUE --force` (VALUE: a value past every "
            "key in use), or fix the row by hand"
        )


class InvalidCount(InvalidSequenceConfig):
    """A count of values to reserve or hand out is not a positive int in range."""


class ValueMovesBackward(InvalidSequenceConfig):
    """A maintenance write would move ``current`` backward without ``force``."""


class InvalidSerial(AutoseqError, ValueError):
    """A text given to `Serial.parse` is not a serial of that template.

    Also importable from `autoseq.serial` and `autoseq` (its homes before 0.x).
    """


class SequenceNotFound(AutoseqError, LookupError):
    """No ``sys_sequence`` row exists for the name and auto-creation is off."""

    def __init__(self, name: str, hint: str = "") -> None:
        self.name = name
        message = f"sequence {name!r} does not exist"
        message += (
            f": {hint}"
            if hint
            else (
                "; register it first (SequenceRegistry.register, `autoseq create`) "
                "or enable auto-creation"
            )
        )
        super().__init__(message)


class SequenceExhausted(AutoseqError):
    """The sequence reached ``end`` and does not cycle."""

    def __init__(self, name: str, current: int, end: int) -> None:
        self.name = name
        self.current = current
        self.end = end
        super().__init__(
            f"sequence {name!r} is exhausted: next value {current} is past end {end}; "
            "raise `end` (`autoseq set`/update the row) or create the sequence with cycle=True"
        )


class StoreUnavailable(AutoseqError):
    """The store could not be reached or did not answer in time.

    ``name``: the sequence concerned, if one; ``operation``: what was being
    done (``"reserve"``, ``"read"``...); ``reason``: why it failed, in one
    line (the driver's error, a timeout). The message says all three.
    """

    def __init__(
        self,
        message: str,
        *,
        name: str | None = None,
        operation: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.name = name
        self.operation = operation
        self.reason = reason
        super().__init__(message)


class Conflict(Exception):
    """The row moved between read and write; try again.

    Internal to the SQL store, which catches it and retries: it never reaches
    a caller, so it is not an `AutoseqError` (`ReservationConflict` is what
    one sees when the retries run out).
    """


class ReservationConflict(StoreUnavailable):
    """Too many concurrent reservations collided; the retry bound was exceeded."""


class UnsupportedInsert(AutoseqError, TypeError):
    """An INSERT that cannot give each row its own value of a generated column.

    ``INSERT ... FROM SELECT`` evaluates a Python-side column default once for
    the whole statement, so every row would get the same value.
    """

    def __init__(self, table: str, column: str, what: str) -> None:
        self.table = table
        self.column = column
        super().__init__(
            f"insert({table}).from_select() would give every row the same value of "
            f"{table}.{column}, which takes one value per row from {what}; nothing was "
            f"written. Name {column!r} in from_select() and select a value for each row, "
            "or insert the rows with a list of dicts (connection.execute(insert(table), "
            "rows)), which takes one value per row"
        )


# snowflake ids --------------------------------------------------------------


class InvalidSnowflakeConfig(AutoseqError, ValueError):
    """A snowflake layout, setting or value to decode is out of range."""


class ClockMovedBackwards(AutoseqError):
    """The clock reads earlier than a timestamp this worker id already issued."""

    def __init__(self, name: str, worker: int, behind_ms: int, hint: str | None = None) -> None:
        self.name = name
        self.worker = worker
        self.behind_ms = behind_ms
        super().__init__(
            f"snowflake {name!r} worker {worker}: the clock is {behind_ms} ms behind the last "
            "timestamp issued on this worker id; refusing rather than risk a duplicate. "
            + (
                hint
                or "Fix the clock (NTP slewing, not stepping), or use "
                "on_clock_backwards='wait' or 'borrow'"
            )
        )


class WorkersExhausted(AutoseqError):
    """Every worker id of a snowflake layout is leased by a live generator."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count
        super().__init__(
            f"snowflake {name!r}: all {count} worker ids are leased by live generators; "
            "close generators you no longer need, wait for stale leases to expire "
            "(lease_ttl), or use more worker_bits (see `autoseq workers`)"
        )


class LeaseLost(AutoseqError):
    """The generator's worker-id lease expired unrenewed or was taken over."""

    def __init__(self, name: str, worker: int | None, reason: str) -> None:
        self.name = name
        self.worker = worker
        super().__init__(
            f"snowflake {name!r} worker {worker}: {reason}; this call issued no id. "
            "Generation resumes once the heartbeat holds a lease again; check that the "
            "store is reachable. Ids issued before are unique only if the store kept every "
            "lease write: a failover to a replica that had not received one can give the "
            "worker id to another generator (make lease writes wait for replicas)"
        )


class GaplessUnavailable(AutoseqError):
    """Gapless numbering was asked where no transaction can hold the number back.

    Gapless values are taken in the caller's own transaction, so a rollback
    gives them back; where there is no such transaction (Redis, autocommit,
    no connection given) the value would be lost, leaving a gap.
    """


class StoreTableInUse(AutoseqError):
    """A migration would drop a store table (``sys_sequence``, ``sys_worker``) that holds rows.

    Every sequence in it would start over and hand out keys already used;
    live snowflake generators would lose their worker-id leases.
    """


class OverlappingSequences(InvalidSequenceConfig):
    """Two sequences meant to hand out disjoint values (residue classes) share one.

    ``first`` and ``second`` are the two configurations, ``value`` the
    smallest value both would hand out.
    """

    def __init__(self, first: object, second: object, value: int) -> None:
        self.first = first
        self.second = second
        self.value = value
        super().__init__(
            f"{first} and {second} would both hand out {value}: independent stores must use "
            "the same step and different offsets below it; build each with "
            "autoseq.residues.residue_class(name, index, of) (index 0..of-1)",
            setting="start",
            rule="overlap",
        )


class UsageError(AutoseqError):
    """A request that cannot be done as asked: a table or column that is missing or
    not an integer, a store that cannot do it (the CLI exits with status 2)."""
