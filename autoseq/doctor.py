"""``doctor``: the checks an operator runs before a deploy, or a monitor runs every minute.

For each sequence of a store it checks:

* ``behind``: ``current`` against ``max()`` of every column or field that
  uses it. A sequence at or below a key already stored (after a restore, a
  failover, a ``loaddata``) would hand that key out again: an error.
* ``invalid_row``: a stored row that fails validation (a hand edit); nothing
  can be reserved from it until it is repaired: an error.
* ``values_left``: values left before ``end`` and, at a recent rate, the time
  until then. Exhausted is an error; past ``warn_share`` of the range or
  under ``warn_seconds`` to go is a warning.

and for the store as a whole:

* ``companion``: on SQLite, the companion file ``<db>.autoseq`` that holds the
  rows (a copy or restore of the database without it restarts every sequence).
* ``redis_persistence``: ``appendonly``/``appendfsync``/``maxmemory-policy``
  (a Redis restart without the rows repeats values).
* ``replication``: whether a failover (or a crash) could repeat values: a
  PostgreSQL primary with asynchronous standbys only, or
  ``synchronous_commit=off``; a Redis with replicas the store does not
  ``WAIT`` for. The store says (``replication_findings()``).
* ``store``: the store answers at all.

[`examine`][autoseq.doctor.examine] returns a [`Report`][autoseq.doctor.Report]; the
``autoseq doctor`` command, ``manage.py autoseq doctor`` and Django's ``check --deploy`` all
print one.
Only the standard library and the core are imported here; drivers are
reached through the store the caller opened.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from autoseq.config import SequenceConfig
from autoseq.errors import AutoseqError, InvalidSequenceConfig, StoreUnavailable, UsageError
from autoseq.stores.base import SequenceStore
from autoseq.stores.capabilities import (
    ChecksItself,
    KnowsFiles,
    ListsStoredNames,
    ReadsColumnMax,
    ReportsReplication,
    replication_check,
)
from autoseq.stores.capabilities import (
    describe as describe,
)

Level = Literal["ok", "warning", "error"]
_RANK: dict[str, int] = {"ok": 0, "warning": 1, "error": 2}

#: Share of a non-cycling range reserved before ``values_left`` warns (as
#: ``BufferPolicy.warn_share``).
WARN_SHARE = 0.9
#: Time to ``end`` at the recent rate under which ``values_left`` warns.
WARN_SECONDS = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class ColumnUse:
    """A column (or document field) whose values come from ``sequence``.

    ``read_max`` returns its largest value (None when empty); an
    ``AutoseqError`` it raises (table missing, not an integer) becomes an
    error finding instead of stopping the other checks.
    """

    label: str
    sequence: str
    read_max: Callable[[], int | None]


@dataclass(frozen=True, slots=True)
class Finding:
    """One result of one check; ``sequence`` None for checks of the store."""

    level: Level
    check: str
    message: str
    sequence: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "level": self.level,
            "check": self.check,
            "sequence": self.sequence,
            "message": self.message,
        }


@dataclass(slots=True)
class SequenceReport:
    """What doctor saw of one sequence; fields are None where unknown (invalid row)."""

    name: str
    current: int | None = None
    end: int | None = None
    step: int | None = None
    cycle: bool | None = None
    values_left: int | None = None
    columns: dict[str, int | None] = field(default_factory=dict)
    rate: float | None = None
    seconds_to_end: float | None = None
    level: Level = "ok"

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "name": self.name,
            "status": self.level,
            "current": self.current,
            "end": self.end,
            "step": self.step,
            "cycle": self.cycle,
            "values_left": self.values_left,
            "rate_per_second": self.rate,
            "seconds_to_end": self.seconds_to_end,
            "columns": [{"column": label, "max": top} for label, top in self.columns.items()],
        }


@dataclass(slots=True)
class Report:
    """Everything one doctor run found, in the order it was checked."""

    store: str
    sequences: list[SequenceReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, check: str, message: str, sequence: str | None = None) -> None:
        """Record a finding (and raise the sequence's level to it)."""
        self.findings.append(Finding(level, check, message, sequence))
        for item in self.sequences:
            if item.name == sequence and _RANK[level] > _RANK[item.level]:
                item.level = level

    @property
    def status(self) -> Level:
        """The worst level found (``ok`` when nothing was found)."""
        worst: Level = "ok"
        for finding in self.findings:
            if _RANK[finding.level] > _RANK[worst]:
                worst = finding.level
        return worst

    def exit_code(self, *, strict: bool = False) -> int:
        """0 when fine, 1 on an error (or, with ``strict``, a warning)."""
        if self.status == "error" or (strict and self.status == "warning"):
            return 1
        return 0

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the ``--json`` shape)."""
        return {
            "status": self.status,
            "store": self.store,
            "sequences": [item.as_dict() for item in self.sequences],
            "findings": [finding.as_dict() for finding in self.findings],
        }

    def to_json(self) -> str:
        """The report as indented JSON."""
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def to_text(self) -> str:
        """A table of the sequences, then every finding that is not ``ok``, then the status."""
        lines = [f"store: {self.store}"]
        headers = ("sequence", "status", "current", "max(columns)", "left", "rate/s", "to end")
        table = [headers]
        for item in self.sequences:
            tops = [top for top in item.columns.values() if top is not None]
            table.append(
                (
                    item.name,
                    item.level,
                    _cell(item.current),
                    _cell(max(tops) if tops else None if item.columns else "-"),
                    "cycles" if item.cycle else _cell(item.values_left, grouped=True),
                    "-" if item.rate is None else f"{item.rate:,.1f}",
                    format_duration(item.seconds_to_end),
                )
            )
        if self.sequences:
            widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
            for row in table:
                lines.append(
                    "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                )
        else:
            lines.append("no sequences")
        problems = [f for f in self.findings if f.level != "ok"]
        notes = [f for f in self.findings if f.level == "ok" and f.sequence is None]
        for finding in [*problems, *notes]:
            where = f"{finding.sequence}: " if finding.sequence else ""
            lines.append(f"{finding.level.upper():7} {finding.check:17} {where}{finding.message}")
        errors = sum(f.level == "error" for f in self.findings)
        warnings = sum(f.level == "warning" for f in self.findings)
        lines.append(f"status: {self.status} ({errors} errors, {warnings} warnings)")
        return "\n".join(lines)


def _cell(value: object, *, grouped: bool = False) -> str:
    if value is None:
        return "?"
    if grouped and isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_duration(seconds: float | None) -> str:
    """``seconds`` as a short human duration (``3.2d``); ``-`` for unknown."""
    if seconds is None:
        return "-"
    for unit, size in (("y", 365 * 86400.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f}{unit}"
    return f"{seconds:.0f}s"


def values_left(row: SequenceConfig) -> int:
    """Values not yet reserved before ``end``: ``row.values_left`` (kept for callers)."""
    return row.values_left


#: Checks other modules add (snowflake worker leases, say): each is called
#: with the store and the report and records its findings with
#: ``report.add(level, check, message, sequence)``.
EXTRA_CHECKS: list[Callable[[SequenceStore, Report], None]] = []


def register_check(check: Callable[[SequenceStore, Report], None]) -> None:
    """Run ``check(store, report)`` in every `examine` from now on (once per function)."""
    if check not in EXTRA_CHECKS:
        EXTRA_CHECKS.append(check)


# reading the store ----------------------------------------------------------------


def sqlite_files(store: SequenceStore) -> tuple[str, str] | None:
    """(application database, companion file) of a SQLite file store, else None."""
    return store.sqlite_files() if isinstance(store, KnowsFiles) else None


def stored_names(store: SequenceStore) -> list[str]:
    """Every sequence name in ``store``, including rows that fail validation."""
    if isinstance(store, ListsStoredNames):  # SQLStore: its companion's rows and gapless ones
        return sorted(str(name) for name in store.stored_names())
    return sorted(row.name for row in store.read_all())


def _read_rows(
    store: SequenceStore, names: Iterable[str], report: Report | None
) -> dict[str, SequenceConfig]:
    rows: dict[str, SequenceConfig] = {}
    for name in names:
        try:
            row = store.read(name)
        except InvalidSequenceConfig as exc:
            if report is not None:
                report.add("error", "invalid_row", _one_line(exc), name)
            continue
        if row is not None:
            rows[name] = row
    return rows


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# the checks -----------------------------------------------------------------------


def examine(
    store: SequenceStore,
    columns: Sequence[ColumnUse] = (),
    *,
    sample: float = 0.0,
    rates: Mapping[str, float] | None = None,
    warn_share: float = WARN_SHARE,
    warn_seconds: float = WARN_SECONDS,
    names: Iterable[str] | None = None,
) -> Report:
    """Run every check on ``store`` and return the report; nothing is written.

    ``columns`` are the columns using each sequence (the caller knows its
    models). The rate for the time to ``end`` comes from ``rates`` (values
    per second by sequence, e.g. a running process's ``stats()``), else from
    watching ``current`` for ``sample`` seconds. ``names`` limits the
    sequences examined.
    """
    report = Report(describe(store))
    if isinstance(store, ChecksItself):  # the store's own checks, from its folder
        for level, what, message in store.doctor_findings():
            report.add(cast(Level, level), what, message)
    else:
        _check_replication(store, report)
    _check_worker_leases(store, report)
    for check in list(EXTRA_CHECKS):
        try:
            check(store, report)
        except AutoseqError as exc:
            report.add("error", getattr(check, "__name__", "check"), _one_line(exc))
    try:
        found = stored_names(store)
        if names is not None:
            every = sorted(set(names))
        else:
            every = sorted(set(found) | {use.sequence for use in columns})
        report.sequences = [SequenceReport(name) for name in every]
        rows = _read_rows(store, [n for n in every if n in found], report)
        measured = dict(rates or {})
        if sample > 0 and rows:
            measured.update(_sample_rates(store, rows, sample))
    except StoreUnavailable as exc:
        report.add("error", "store", f"the store did not answer: {_one_line(exc)}")
        return report
    for item in report.sequences:
        row = rows.get(item.name)
        uses = [use for use in columns if use.sequence == item.name]
        tops = _column_maxima(uses, item, report)
        if row is None:
            if item.name not in found:
                _check_missing(item, tops, report)
            continue
        item.current, item.end, item.step, item.cycle = row.next_value, row.end, row.step, row.cycle
        item.values_left = row.values_left
        item.rate = measured.get(item.name)
        _check_behind(row, tops, report)
        _check_values_left(row, item, report, warn_share=warn_share, warn_seconds=warn_seconds)
    return report


def _column_maxima(uses: list[ColumnUse], item: SequenceReport, report: Report) -> dict[str, int]:
    tops: dict[str, int] = {}
    for use in uses:
        try:
            top = use.read_max()
        except AutoseqError as exc:
            report.add("error", "column", f"{use.label}: {_one_line(exc)}", item.name)
            continue
        item.columns[use.label] = top
        if top is not None:
            tops[use.label] = top
    return tops


def _check_missing(item: SequenceReport, tops: dict[str, int], report: Report) -> None:
    if not tops:
        report.add("ok", "behind", "no row yet; it is created on first use", item.name)
        return
    label, top = max(tops.items(), key=lambda pair: pair[1])
    report.add(
        "warning",
        "behind",
        f"no row, but {label} holds keys up to {top}: the autoseq integrations create the "
        f"row past them on first use; anything else would start at start. Create it now "
        f"with `autoseq create {item.name}` then `autoseq sync {item.name} --past {top}`",
        item.name,
    )


def _check_behind(row: SequenceConfig, tops: dict[str, int], report: Report) -> None:
    if not tops:
        return
    label, top = max(tops.items(), key=lambda pair: pair[1])
    if row.cycle:
        report.add(
            "ok",
            "behind",
            f"cycles, so values repeat by design (max({label}) = {top}, next {row.next_value})",
            row.name,
        )
        return
    if row.next_value <= top:
        report.add(
            "error",
            "behind",
            f"next value {row.next_value} is not past max({label}) = {top}: keys from "
            f"{row.next_value} to {top} would be handed out again. Stop writers, then "
            f"`autoseq sync {row.name} --past {top}` (or `manage.py autoseq sync`)",
            row.name,
        )
        return
    report.add(
        "ok", "behind", f"next value {row.next_value} is past max({label}) = {top}", row.name
    )


def _check_values_left(
    row: SequenceConfig,
    item: SequenceReport,
    report: Report,
    *,
    warn_share: float,
    warn_seconds: float,
) -> None:
    if row.cycle:
        return
    left = row.values_left
    if item.rate:
        item.seconds_to_end = left / item.rate
    if left == 0:
        report.add(
            "error",
            "values_left",
            f"exhausted: every value up to end={row.end} is reserved; raise end "
            f"(`autoseq change {row.name} --end E`)",
            row.name,
        )
        return
    span = row.range_size
    used = 1 - left / span
    if item.seconds_to_end is not None and item.seconds_to_end < warn_seconds:
        report.add(
            "warning",
            "values_left",
            f"{left:,} values left before end={row.end}: about "
            f"{format_duration(item.seconds_to_end)} at {item.rate:,.1f}/s; raise end "
            f"(`autoseq change {row.name} --end E`)",
            row.name,
        )
    elif used >= warn_share:
        report.add(
            "warning",
            "values_left",
            f"{used:.1%} of the range is reserved, {left:,} values left before end={row.end}",
            row.name,
        )


def _sample_rates(
    store: SequenceStore, rows: dict[str, SequenceConfig], seconds: float
) -> dict[str, float]:
    """Values reserved per second by each sequence while we watch for ``seconds``."""
    started = time.monotonic()
    time.sleep(seconds)
    later = _read_rows(store, rows, None)
    elapsed = time.monotonic() - started
    rates: dict[str, float] = {}
    for name, before in rows.items():
        after = later.get(name)
        if after is None or after.next_value < before.next_value:
            continue  # gone, or wrapped around (cycle) or forced back: no honest rate
        rates[name] = (after.next_value - before.next_value) / before.step / elapsed
    return rates


def _check_worker_leases(store: SequenceStore, report: Report) -> None:
    """Snowflake worker leases (``sys_worker``): held, expired, and clocks behind them."""
    files = sqlite_files(store)
    if files is not None and not os.path.exists(files[1]):
        return  # opening it would create an empty companion file
    from autoseq.errors import InvalidSnowflakeConfig
    from autoseq.workers import LAYOUT_ROW, worker_leases

    try:
        leases = worker_leases(store).list_workers(layouts=True)
    except InvalidSnowflakeConfig:
        return  # a store of another kind cannot hold leases
    except StoreUnavailable:
        return  # reported once, by the sequence checks below
    now = time.time_ns() // 1_000_000
    # A fresh layout's first ids are stamped up to its grace's end, by design;
    # the row was not written after now, whatever the clock that wrote it said.
    grace = {
        row.name: min(row.expires_ms, now + row.expires_ms - row.last_ms)
        for row in leases
        if row.worker == LAYOUT_ROW
    }
    leases = [row for row in leases if row.worker != LAYOUT_ROW]
    for name in sorted({lease.name for lease in leases}):
        rows = [lease for lease in leases if lease.name == name]
        held = sum(1 for row in rows if row.owner is not None and row.expires_ms >= now)
        expired = sum(1 for row in rows if row.owner is not None and row.expires_ms < now)
        report.add(
            "ok",
            "worker_leases",
            f"snowflake {name!r}: {held} worker ids held, {expired} expired (free to take "
            f"over), {len(rows) - held - expired} released",
        )
        ahead = max(row.last_ms for row in rows) - max(now, grace.get(name, 0))
        if ahead > 1000:
            report.add(
                "warning",
                "worker_leases",
                f"snowflake {name!r}: this machine's clock is {ahead / 1000:.1f} s behind the "
                "last timestamp recorded for one of its worker ids; a generator started here "
                "waits that long (or refuses, with on_clock_backwards='fail'); check NTP",
            )


def _check_replication(store: SequenceStore, report: Report) -> None:
    if isinstance(store, ReportsReplication):
        for level, what, message in replication_check(store):
            report.add(cast(Level, level), what, message)


def column_hints(store: SequenceStore, hints: Iterable[str]) -> list[ColumnUse]:
    """``TABLE.COLUMN[=SEQUENCE]`` hints as column uses on ``store``'s database."""
    from autoseq.config import validate_name

    found: list[ColumnUse] = []
    for hint in hints:
        where, _, sequence = hint.partition("=")
        table, dot, column = where.rpartition(".")
        if not dot or not table or not column:
            raise UsageError(f"--column {hint!r}: write TABLE.COLUMN or TABLE.COLUMN=SEQUENCE")
        if not isinstance(store, ReadsColumnMax):
            raise UsageError(f"--column needs a SQL or MongoDB --url, not {type(store).__name__}")
        name = sequence or table.rpartition(".")[2]
        try:
            validate_name(name)
        except InvalidSequenceConfig as exc:
            raise UsageError(f"--column {hint!r}: {exc}") from None
        found.append(ColumnUse(where, name, _reader(store, table, column)))
    return found


def _reader(store: SequenceStore, table: str, column: str) -> Callable[[], int | None]:
    def read_max() -> int | None:
        if not isinstance(store, ReadsColumnMax):
            raise UsageError(f"--column needs a SQL or MongoDB --url, not {type(store).__name__}")
        try:
            return store.column_max(table, column)
        except AutoseqError:
            raise
        except Exception as exc:  # any driver's error: a finding, not a crash
            raise StoreUnavailable(f"reading max({table}.{column}) failed: {exc}") from exc

    return read_max


def metadata_columns(store: SequenceStore, spec: str) -> list[ColumnUse]:
    """The sequence columns of the SQLAlchemy metadata ``MODULE:NAME`` names."""
    import importlib
    import sys

    # As alembic and gunicorn do: a console script does not have the current
    # directory on sys.path, where the application's package usually is.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"--metadata {spec!r}: write MODULE:NAME, e.g. myapp.models:Base")
    try:
        target: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--metadata {spec!r}: {exc}") from None
    target = getattr(target, "metadata", target)
    tables = target.tables.values() if hasattr(target, "tables") else [target]
    found: list[ColumnUse] = []
    for table in tables:
        for column in getattr(table, "columns", ()):
            carried = (getattr(column, "info", None) or {}).get("autoseq")
            config_for = getattr(carried, "config_for", None)
            if config_for is None:
                continue
            name = config_for(column).name
            label = f"{table.fullname}.{column.name}"
            found.append(ColumnUse(label, name, _reader(store, table.fullname, column.name)))
    if not found:
        raise UsageError(f"--metadata {spec!r}: no table in it has an autoseq sequence column")
    return found


#: Moved to `autoseq.cli.doctor` (the library never imports the CLI).
_MOVED_TO_CLI = ("HELP", "configure_cli", "run_cli")


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_CLI:
        import importlib
        import warnings

        warnings.warn(
            f"autoseq.doctor.{name} moved to autoseq.cli.doctor.{name}; the old name goes "
            "in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("autoseq.cli.doctor"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
