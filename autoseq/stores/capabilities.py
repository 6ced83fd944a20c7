"""What a store can do beyond ``SequenceStore``, as types.

Each capability is a small protocol a store implements by having the method;
callers ask ``isinstance(store, Capability)``, never a class or module name,
so an application's subclass of a store keeps every capability and a
third-party store gains one by defining the method. Nothing here imports a
driver: a store imports its own code for a capability when it is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from autoseq.config import SequenceConfig
    from autoseq.stores.base import Block
    from autoseq.workers import WorkerLeases


@runtime_checkable
class LeasesWorkers(Protocol):
    """Keeps snowflake worker-id leases beside its rows (``sys_worker``)."""

    def worker_leases(self) -> WorkerLeases:
        """The lease operations, one object per store (it may cache a table handle)."""
        ...


@runtime_checkable
class GaplessEngine(Protocol):
    """Takes gapless values inside the caller's transaction."""

    def take(self, connection: Any, store: Any, config: SequenceConfig, count: int) -> list[int]:
        """``count`` consecutive values of ``config``'s row, in ``connection``'s transaction."""
        ...


@runtime_checkable
class GaplessNumbering(Protocol):
    """Can number without gaps: values taken in the caller's transaction."""

    def gapless_engine(self) -> GaplessEngine:
        """The engine taking gapless values on this store."""
        ...


@runtime_checkable
class ReadsColumnMax(Protocol):
    """Reads ``max()`` of an integer column (SQL) or field (MongoDB) of the application."""

    def column_max(self, table: str, column: str) -> int | None:
        """The largest value in ``table.column``, None when empty; ``UsageError`` when
        the table or column is missing or not an integer."""
        ...


@runtime_checkable
class ReleasesMany(Protocol):
    """Hands many blocks back in few round trips (``release`` of each, the same compare-and-set).

    One transaction on SQL; a pipeline (Redis) or an unordered bulk write (MongoDB)
    elsewhere: a failure part way leaves the blocks not yet handed back as gaps.
    """

    def release_many(self, blocks: list[Block]) -> list[bool]:
        """``release(block)`` of each, in order; whether each went back."""
        ...


@runtime_checkable
class CreatesMany(Protocol):
    """Creates many rows in one transaction (``create`` of each, one commit)."""

    def create_many(self, configs: list[SequenceConfig]) -> list[SequenceConfig]:
        """``create(config)`` of each, in order: the stored rows (an existing row wins)."""
        ...


@runtime_checkable
class ReservesMany(Protocol):
    """Reserves a block of many sequences in one round trip (a compare-and-set each)."""

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """For each ``(name, count)``, in order, the block ``reserve(name, count)`` would
        return, or None where it reserved nothing (reserve that one alone)."""
        ...


@runtime_checkable
class ReadsRowValues(Protocol):
    """Reads every row as plain tuples in `autoseq.config.ROW_COLUMNS` order, unchecked."""

    def read_all_values(self) -> list[Any]: ...


@runtime_checkable
class ListsStoredNames(Protocol):
    """Lists every row's name, including rows that fail validation."""

    def stored_names(self) -> list[str]: ...


@runtime_checkable
class Locates(Protocol):
    """Says where its rows live, for people (no password)."""

    def location(self) -> str: ...


@runtime_checkable
class CreatesTable(Protocol):
    """Has a table (or the like) that an operator creates once: ``autoseq init``."""

    def create_table(self) -> None: ...


@runtime_checkable
class KnowsFiles(Protocol):
    """Keeps its rows in files that may not exist yet (SQLite)."""

    def rows_may_exist(self) -> bool:
        """Whether a row can exist, without creating an empty file to find out."""
        ...

    def sqlite_files(self) -> tuple[str, str] | None:
        """(application database, companion file), or None when not file-backed."""
        ...


@runtime_checkable
class ReadsRawRows(Protocol):
    """Reads a row as stored, even one that fails validation (for repair)."""

    def read_raw(self, name: str) -> dict[str, Any] | None: ...


@runtime_checkable
class ReportsReplication(Protocol):
    """Can tell whether a reservation survives a failover (for doctor)."""

    def replication_findings(self) -> list[tuple[str, str]]:
        """(level, message) pairs; ``StoreUnavailable`` when it cannot be checked."""
        ...


@runtime_checkable
class ChecksItself(Protocol):
    """Has checks of its own for ``autoseq doctor`` (kept in the store's folder)."""

    def doctor_findings(self) -> list[tuple[str, str, str]]:
        """(level, check, message) findings: level is "ok", "warning" or "error"."""
        ...


def one_per_store(store: object, make: Callable[[], WorkerLeases]) -> WorkerLeases:
    """``store``'s lease object, made by ``make`` on first use and kept on the store."""
    held: WorkerLeases | None = vars(store).get("_worker_leases")
    if held is None:
        held = make()
        vars(store)["_worker_leases"] = held
    return held


def replication_check(store: ReportsReplication) -> list[tuple[str, str, str]]:
    """Doctor's ``replication`` findings of ``store``; a store that cannot be asked
    gives one warning instead of failing the report."""
    from autoseq.errors import StoreUnavailable

    try:
        found = store.replication_findings()
    except StoreUnavailable as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return [("warning", "replication", f"could not be checked: {reason}")]
    return [(level, "replication", message) for level, message in found]


def describe(store: object) -> str:
    """The store's class and where it keeps its rows (no password), for people."""
    if isinstance(store, Locates):
        return f"{type(store).__name__} {store.location()}"
    return type(store).__name__


__all__ = [
    "ChecksItself",
    "CreatesMany",
    "CreatesTable",
    "GaplessEngine",
    "GaplessNumbering",
    "KnowsFiles",
    "LeasesWorkers",
    "ListsStoredNames",
    "Locates",
    "ReadsColumnMax",
    "ReadsRawRows",
    "ReadsRowValues",
    "ReleasesMany",
    "ReportsReplication",
    "ReservesMany",
    "describe",
    "one_per_store",
    "replication_check",
]
