"""``Serial``: numbers people read (``INV-2026-00042``), one sequence row per period.

A serial is a ``str.format`` template over a counter ``{n}`` and the
period's date ``{date}``. With a ``period`` each day, month or year has its
own ``sys_sequence`` row, ``<name>:<period key>`` (``invoices:2026-11``),
created on first use, so the counter restarts each period on every store and
a block reserved in one period can never be served in the next: it belongs
to another row. Values come from a :class:`~autoseq.SequenceLock` (blocks in
memory), or with ``gapless=True`` one at a time inside the caller's
transaction (:mod:`autoseq.gapless`).
"""

from __future__ import annotations

import re
import string
import threading
import weakref
from collections.abc import Callable
from datetime import UTC, date, datetime, tzinfo
from typing import Any

from autoseq import _hooks
from autoseq.config import MAX_VALUE, SequenceConfig, utc_now, validate_name
from autoseq.errors import AutoseqError, GaplessUnavailable, InvalidSequenceConfig
from autoseq.lock import SequenceLock, check_count
from autoseq.registry import SequenceRegistry
from autoseq.stores.base import SequenceStore

PERIODS = ("day", "month", "year")
#: strftime directives a ``{date}`` spec may use, with the text each produces.
_DATE_DIRECTIVES = {
    "Y": r"\d{4}",
    "y": r"\d{2}",
    "m": r"\d{2}",
    "d": r"\d{2}",
    "j": r"\d{3}",
    "b": r"[^\W\d_]+",
    "B": r"[^\W\d_]+",
    "a": r"[^\W\d_]+",
    "A": r"[^\W\d_]+",
    "%": "%",
}
#: Which directives show each part of a date (a period must be visible in its serials).
_SHOWS = {"year": set("Yy"), "month": set("mbB"), "day": set("dj")}
_NEEDS = {"year": ("year",), "month": ("year", "month"), "day": ("year", "day")}
_DIRECTIVE = re.compile(r"%(.?)")
_N_SPEC = re.compile(r"^(?:0(?P<width>[1-9]\d*))?d?$")
_KEY_FORMAT = {"day": "%Y-%m-%d", "month": "%Y-%m", "year": "%Y"}


class InvalidSerial(AutoseqError, ValueError):
    """A text given to :meth:`Serial.parse` is not a serial of that template."""


def _period_start(local: datetime, period: str) -> date:
    if period == "day":
        return local.date()
    if period == "month":
        return date(local.year, local.month, 1)
    return date(local.year, 1, 1)


class _Template:
    """A validated serial template: how to format it per period and how to parse it."""

    def __init__(self, template: object, period: str | None) -> None:
        if not isinstance(template, str):
            raise InvalidSequenceConfig(
                f"serial template must be a str, got {type(template).__name__} {template!r}"
            )
        self.text = template
        self.pieces: list[tuple[str, str]] = []  # ("lit" | "n" | "date", text or spec)
        self.width: int | None = None
        self.date_spec: str | None = None
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise InvalidSequenceConfig(
                f"serial template {template!r} is not a valid str.format template ({exc}); "
                "write a literal brace as {{ or }}"
            ) from None
        for literal, field, spec, conversion in parsed:
            if literal:
                self.pieces.append(("lit", literal))
            if field is None:
                continue
            if field not in ("n", "date"):
                raise InvalidSequenceConfig(
                    f"serial template {template!r} uses {{{field}}}; only {{n}} (the counter) "
                    "and {date} (the period's date) are available"
                )
            if conversion:
                raise InvalidSequenceConfig(
                    f"serial template {template!r}: {{{field}!{conversion}}} converts the value "
                    f"to text; drop the !{conversion}"
                )
            if any(kind == field for kind, _ in self.pieces):
                raise InvalidSequenceConfig(
                    f"serial template {template!r} uses {{{field}}} twice; use it once"
                )
            if "{" in (spec or ""):
                raise InvalidSequenceConfig(
                    f"serial template {template!r}: nested fields in a format spec are not "
                    "supported; write the spec literally"
                )
            if field == "n":
                self._check_n(spec or "")
            else:
                self._check_date(spec or "%Y-%m-%d", period)
            self.pieces.append((field, spec or ("%Y-%m-%d" if field == "date" else "")))
        if not any(kind == "n" for kind, _ in self.pieces):
            raise InvalidSequenceConfig(
                f"serial template {template!r} has no {{n}}; put the counter in it, "
                "e.g. 'INV-{n:05d}'"
            )
        if period is not None and self.date_spec is None:
            raise InvalidSequenceConfig(
                f"serial template {template!r} with period={period!r} has no {{date}}: the "
                "counter restarts each period, so serials would repeat; add e.g. "
                f"{{date:{_KEY_FORMAT[period].replace('-', '')}}}"
            )
        if period is None and self.date_spec is not None:
            raise InvalidSequenceConfig(
                f"serial template {template!r} uses {{date}} but period is None; "
                "give period='day', 'month' or 'year'"
            )
        self.pattern = re.compile("".join(self._regex(kind, text) for kind, text in self.pieces))

    def _check_n(self, spec: str) -> None:
        match = _N_SPEC.match(spec)
        if match is None:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r}: {{n:{spec}}} is not supported; use {{n}}, "
                "{n:d} or a zero-padded fixed width such as {n:06d}"
            )
        if match["width"]:
            self.width = int(match["width"])
            if 10**self.width - 1 > MAX_VALUE:
                raise InvalidSequenceConfig(
                    f"serial template {self.text!r}: {{n:{spec}}} is wider than a 64-bit "
                    "counter can fill; use a width of 18 digits or fewer"
                )

    def _check_date(self, spec: str, period: str | None) -> None:
        shown: set[str] = set()
        directives = _DIRECTIVE.findall(spec)
        for directive in directives:
            if directive not in _DATE_DIRECTIVES:
                raise InvalidSequenceConfig(
                    f"serial template {self.text!r}: %{directive} is not allowed in {{date}}; "
                    f"{{date}} is the period's date, use only "
                    + " ".join(f"%{d}" for d in _DATE_DIRECTIVES)
                )
            for part, letters in _SHOWS.items():
                if directive in letters:
                    shown.add(part)
        if "j" in directives:
            shown.add("month")
        if period is not None:
            missing = [part for part in _NEEDS[period] if part not in shown]
            if missing:
                raise InvalidSequenceConfig(
                    f"serial template {self.text!r}: {{date:{spec}}} does not show the "
                    f"{' and '.join(missing)}, so serials of different {period}s would repeat; "
                    f"use e.g. {{date:{_KEY_FORMAT[period].replace('-', '')}}}"
                )
        self.date_spec = spec

    def _regex(self, kind: str, text: str) -> str:
        if kind == "lit":
            return re.escape(text)
        if kind == "n":
            return rf"(?P<n>\d{{{self.width}}})" if self.width else r"(?P<n>\d+)"
        out = []
        for part in re.split(r"(%.)", text):
            if part.startswith("%") and len(part) == 2:
                out.append(_DATE_DIRECTIVES[part[1]])
            else:
                out.append(re.escape(part))
        return "(?P<date>" + "".join(out) + ")"

    def for_period(self, day: date | None) -> str:
        """The template with the date filled in, leaving only ``{n...}`` to format."""
        out = []
        for kind, text in self.pieces:
            if kind == "n":
                out.append("{n:" + text + "}")
            elif kind == "lit":
                out.append(text.replace("{", "{{").replace("}", "}}"))
            else:
                assert day is not None
                out.append(format(day, text).replace("{", "{{").replace("}", "}}"))
        return "".join(out)

    @property
    def max_length(self) -> int:
        """The longest serial this template makes (a fixed width, or a 19-digit counter)."""
        sample = date(2000, 12, 31)  # two-digit month and day; %B names are measured below
        longest_name = 9  # "September", "Wednesday" in English
        total = 0
        for kind, text in self.pieces:
            if kind == "lit":
                total += len(text)
            elif kind == "n":
                total += self.width or len(str(MAX_VALUE))
            else:
                total += len(format(sample, text.replace("%B", "").replace("%A", "")))
                total += longest_name * (text.count("%B") + text.count("%A"))
        return total


class Serial:
    """Formatted serial numbers of one name, ``next()`` -> ``"INV-2026-00042"``.

    ``store`` is any store or a :class:`~autoseq.SequenceRegistry`. ``clock``
    returns the current aware datetime (injectable for tests); the period
    switches at its boundary in ``tz``. A zero-padded ``{n:0Wd}`` ends the
    counter at ``10**W - 1``: past it ``SequenceExhausted``, or with
    ``cycle=True`` a wrap back to ``start`` (values then repeat, once every
    ``10**W`` values of a period). ``gapless=True`` takes each value in the
    caller's SQL transaction instead of from a block: ``next(connection)``.
    """

    def __init__(
        self,
        store: SequenceStore | SequenceRegistry,
        name: str,
        template: str,
        *,
        period: str | None = None,
        tz: str | tzinfo = "UTC",
        start: int = 1,
        step: int = 1,
        batch_count: int = 100,
        gapless: bool = False,
        cycle: bool = False,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        validate_name(name)
        if period not in (None, *PERIODS):
            raise InvalidSequenceConfig(
                f"serial {name!r}: period={period!r}; use 'day', 'month', 'year' or None"
            )
        self.name = name
        self.period = period
        self.template = _Template(template, period)
        self.tz = _zone(tz)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidSequenceConfig(
                f"serial {name!r}: start={start!r}; a serial counter starts at 0 or more"
            )
        end = 10**self.template.width - 1 if self.template.width else MAX_VALUE
        if start > end:
            raise InvalidSequenceConfig(
                f"serial {name!r}: start={start} does not fit {template!r} "
                f"(at most {end}); widen the {{n}} field"
            )
        longest = len(self._row_name(date(2000, 12, 31)))
        if longest > 191:
            raise InvalidSequenceConfig(
                f"serial {name!r}: the period's row name would be {longest} characters "
                "long; the limit is 191, use a shorter name"
            )
        # Validates start, step, batch_count and gapless as for any sequence.
        self.config = SequenceConfig(
            name,
            start=start,
            end=end,
            step=step,
            batch_count=batch_count,
            cycle=cycle,
            gapless=gapless,
        )
        if isinstance(store, SequenceRegistry):
            self.registry = store
        else:
            self.registry = SequenceRegistry(store)
        self.store = self.registry.store
        if self.gapless:
            _gapless_module(self.store, name)
        self.clock = clock or utc_now
        self._configs: dict[date | None, SequenceConfig] = {}
        self._formats: dict[date | None, Callable[..., str]] = {}
        self._reset_state()
        _serials.add(self)

    @property
    def gapless(self) -> bool:
        """True when each value is taken in the caller's transaction (``config.gapless``)."""
        return self.config.gapless

    def _reset_state(self) -> None:
        self._guard = threading.Lock()
        self._token: object = None
        self._day: date | None = None
        self._lock: SequenceLock | None = None
        self._format: Callable[..., str] = str.format

    def _row_name(self, day: date | None) -> str:
        if self.period is None or day is None:
            return self.name
        return f"{self.name}:{day.strftime(_KEY_FORMAT[self.period])}"

    def period_key(self, day: date | None) -> str | None:
        """The key of the period starting on ``day`` (``"2026-11"``), None without a period."""
        if self.period is None or day is None:
            return None
        return day.strftime(_KEY_FORMAT[self.period])

    def _now(self) -> date | None:
        if self.period is None:
            return None
        now = self.clock()
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise InvalidSequenceConfig(
                f"serial {self.name!r}: the clock returned {now!r}; it must return an aware "
                "datetime, e.g. datetime.now(UTC)"
            )
        return _period_start(now.astimezone(self.tz), self.period)

    def row_config(self, day: date | None) -> SequenceConfig:
        """The ``sys_sequence`` row of the period starting on ``day``."""
        found = self._configs.get(day)
        if found is None:
            if len(self._configs) >= 8:  # only the latest periods are asked for again
                self._configs.clear()
            found = self._configs[day] = self.config.replace(name=self._row_name(day))
        return found

    def _formatter(self, day: date | None) -> Callable[..., str]:
        """``str.format`` of the period starting on ``day`` (built once per period)."""
        found = self._formats.get(day)
        if found is None:
            if len(self._formats) >= 8:  # only the latest periods are asked for again
                self._formats.clear()
            found = self._formats[day] = self.template.for_period(day).format
        return found

    def _switch(self, day: date | None) -> SequenceLock:
        """Serve from ``day``'s row from now on; called under the guard."""
        old = self._lock
        lock = self.registry.register(self.row_config(day))
        self._day, self._token, self._lock = day, day, lock
        self._format = self._formatter(day)
        if old is not None and old is not lock:
            # Its unused tail goes back to the old period's row, never to the new one.
            self.registry.discard(old.name, release=True)
        return lock

    def _take(self, count: int) -> tuple[date | None, list[int]]:
        for _attempt in range(3):
            with self._guard:
                day = self._now()
                lock = self._lock
                if lock is None or day != self._token:
                    lock = self._switch(day)
                try:
                    values = [lock.next()] if count == 1 else lock.next_many(count)
                except AutoseqError:
                    if not lock._closed:
                        raise
                    # Another Serial on the same registry switched away and
                    # closed the shared lock: register the row again.
                    self._lock = None
                    continue
                return day, values
        raise AutoseqError(f"serial {self.name!r}: its sequence lock kept being closed")

    def next(self, connection: Any = None) -> str:
        """The next serial; with ``gapless=True``, taken in ``connection``'s transaction."""
        if self.gapless:
            return self._next_gapless(connection, 1)[0]
        _day, values = self._take(1)
        return self._format(n=values[0])

    def next_many(self, n: int, connection: Any = None) -> list[str]:
        """``n`` serials of one period, in the order taken."""
        check_count(n)  # before any row is created
        if self.gapless:
            return self._next_gapless(connection, n) if n else []
        _day, values = self._take(n) if n else (None, [])
        fmt = self._format
        return [fmt(n=value) for value in values]

    def _next_gapless(self, connection: Any, count: int) -> list[str]:
        day = self._now()
        config = self.row_config(day)
        values = _gapless_module(self.store, self.name).take(connection, self.store, config, count)
        fmt = self._formatter(day)
        return [fmt(n=value) for value in values]

    def format(self, counter: int, day: date | None = None) -> str:
        """The serial of ``counter`` in the period starting on ``day`` (no value is taken)."""
        return self._formatter(day)(n=counter)

    def parse(self, text: str) -> tuple[str | None, int]:
        """``(period key, counter)`` of a serial made by this template; ``InvalidSerial`` else."""
        match = self.template.pattern.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r} (template {self.template.text!r})"
            )
        counter = int(match["n"])
        if self.period is None or self.template.date_spec is None:
            return None, counter
        try:
            stamped = datetime.strptime(match["date"], self.template.date_spec)
        except ValueError as exc:
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r}: its date {match['date']!r} "
                f"does not read as {self.template.date_spec!r} ({exc})"
            ) from None
        return self.period_key(_period_start(stamped, self.period)), counter

    @property
    def max_length(self) -> int:
        """The longest serial the template can produce (for a string column's length)."""
        return self.template.max_length

    def close(self) -> None:
        """Hand the current period's unused tail back and forget it."""
        with self._guard:
            if self._lock is not None:
                self.registry.discard(self._lock.name, release=True)
            self._lock, self._token = None, None

    def __repr__(self) -> str:
        return f"Serial({self.name!r}, {self.template.text!r}, period={self.period!r})"


def _gapless_module(store: object, name: str) -> Any:
    """The module taking gapless values on ``store``, or ``GaplessUnavailable``.

    Looked up by the store's own module, so neither SQLAlchemy nor pymongo
    is imported for a store that does not already use it.
    """
    module = type(store).__module__
    if module == "autoseq.stores.sql":
        from autoseq import gapless

        return gapless
    if module == "autoseq.stores.mongo":
        from autoseq import gapless_mongo

        return gapless_mongo
    raise GaplessUnavailable(
        f"sequence {name!r}: gapless=True needs a SQLStore or a MongoStore, got "
        f"{type(store).__name__}: a gapless value is taken in the caller's transaction so a "
        "rollback gives it back, and this store has no such transaction; use gapless=False "
        "(blocks, gaps possible) or a SQL database"
    )


def _zone(tz: str | tzinfo) -> tzinfo:
    if isinstance(tz, tzinfo):
        return tz
    if not isinstance(tz, str):
        raise InvalidSequenceConfig(f"tz must be a zone name or a tzinfo, got {tz!r}")
    if tz.upper() == "UTC":
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSequenceConfig(
            f"tz={tz!r} is not a known time zone; use an IANA name such as 'Europe/Paris' "
            "(install the tzdata package where the system has no zone database)"
        ) from None


_serials: weakref.WeakSet[Serial] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The guard may have been held by a thread that does not exist in the
    # child; the locks it pointed to were reset by lock.py's own hook.
    for serial in list(_serials):
        serial._reset_state()


_hooks.on_fork(after_in_child=_after_fork_in_child)
