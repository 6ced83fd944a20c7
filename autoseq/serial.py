"""``Serial``: numbers people read (``INV-2026-00042``), one sequence row per period.

A serial is a ``str.format`` template over a counter ``{n}`` and the
period's date ``{date}``. With a ``period`` each day, month or year has its
own ``sys_sequence`` row, ``<name>:<period key>`` (``invoices:2026-11``),
created on first use, so the counter restarts each period on every store and
a block reserved in one period can never be served in the next: it belongs
to another row. Values come from a [`SequenceLock`][autoseq.lock.SequenceLock] (blocks in
memory), or with ``gapless=True`` one at a time inside the caller's
transaction ([`autoseq.stores.sql.gapless`][autoseq.stores.sql.gapless]).
"""

from __future__ import annotations

import math
import re
import string
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any, NamedTuple

from autoseq import _hooks
from autoseq.config import MAX_VALUE, SequenceConfig, utc_now, validate_name
from autoseq.errors import AutoseqError, GaplessUnavailable, InvalidSequenceConfig
from autoseq.errors import InvalidSerial as InvalidSerial  # its home before 0.x
from autoseq.lock import SequenceLock
from autoseq.registry import SequenceRegistry
from autoseq.stores.base import SequenceStore, check_many
from autoseq.stores.capabilities import GaplessEngine, GaplessNumbering
from autoseq.stores.memory import MemoryStore

PERIODS = ("day", "month", "year")
_KEY_FORMAT = {"day": "%Y-%m-%d", "month": "%Y-%m", "year": "%Y"}
_MONTHS: tuple[str, ...] = ("January", "February", "March", "April", "May", "June", "July")
_MONTHS += ("August", "September", "October", "November", "December")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class _Directive(NamedTuple):
    """A strftime directive ``{date}`` may use: what it shows, how it is written and read."""

    shows: str  # "year", "month", "day" (of the month), "yday" (of the year) or ""
    render: Callable[[date], str]
    regex: str
    width: int  # its longest text


def _number(shows: str, value: Callable[[date], int], width: int, fill: str = "0") -> _Directive:
    """A number padded to ``width`` with ``fill`` (``%e`` pads the day with a space)."""
    spec = f"{fill}>{width}d"
    chars = "0-9" if fill == "0" else f"{fill}0-9"
    return _Directive(shows, lambda d: format(value(d), spec), f"[{chars}]{{{width}}}", width)


def _name(
    shows: str, names: tuple[str, ...], index: Callable[[date], int], cut: int = 0
) -> _Directive:
    shown = tuple(name[:cut] if cut else name for name in names)
    # Longest first, so that a name is never cut short by one it starts with.
    regex = "|".join(sorted(shown, key=len, reverse=True))
    return _Directive(shows, lambda d: shown[index(d)], regex, max(map(len, shown)))


_ABBREVIATED_MONTH = _name("month", _MONTHS, lambda d: d.month - 1, 3)
#: Written here, never by the C library: the same text in every process, whatever its
#: locale (``%b`` is ``Nov`` everywhere) or platform (``%Y`` is always four digits).
_DIRECTIVES = {
    "Y": _number("year", lambda d: d.year, 4),
    "y": _number("year", lambda d: d.year % 100, 2),
    "m": _number("month", lambda d: d.month, 2),
    "b": _ABBREVIATED_MONTH,
    "h": _ABBREVIATED_MONTH,
    "B": _name("month", _MONTHS, lambda d: d.month - 1),
    "d": _number("day", lambda d: d.day, 2),
    "e": _number("day", lambda d: d.day, 2, fill=" "),
    "j": _number("yday", lambda d: d.timetuple().tm_yday, 3),
    "a": _name("", _WEEKDAYS, date.weekday, 3),
    "A": _name("", _WEEKDAYS, date.weekday),
    "u": _number("", date.isoweekday, 1),
    "w": _number("", lambda d: d.isoweekday() % 7, 1),
    "%": _Directive("", lambda d: "%", "%", 1),
}
#: Shorthands written out before anything else (the same on every platform).
_EXPANSIONS = {"F": "%Y-%m-%d", "D": "%m/%d/%y"}
_TIME = "it is a time of day, and {date} is the period's first day, which has none"
_FLAG = "it is a platform-specific strftime flag; write the directive plainly (%d is zero-padded)"
#: Directives refused, with why and what to write instead.
_REFUSED = {
    "G": "it is the ISO week-based year, which differs from the calendar year around "
    "1 January (1 January 2027 is in ISO year 2026); use %Y",
    "C": "it is the century alone; use %Y",
    "x": "it depends on the locale; write what you want shown, e.g. %Y-%m-%d, or %m/%d/%y "
    "(what %x shows in the C locale)",
    "c": "it depends on the locale and shows a time; write e.g. %a %b %e %Y",
    **dict.fromkeys(
        "UWV",
        "it is a week number, and periods are days, months and years; show the day with "
        "%m and %d, or %j (the day of the year)",
    ),
    **dict.fromkeys("HIklMSpPfzZXTRrs", _TIME),
    **dict.fromkeys("-_0^#EO", _FLAG),
    "": "a lone % ends the spec; write a literal % as %%",
}
_UNKNOWN = (
    "use only " + " ".join(f"%{d}" for d in _DIRECTIVES) + " (or %F for %Y-%m-%d, %D for %m/%d/%y)"
)
_PART_HINT = {
    "year": "the year (%Y)",
    "month": "the month (%m, %b or %B)",
    "day": "the day of the month (%d)",
}
_DIRECTIVE = re.compile(r"%(.?)", re.DOTALL)
_N_SPEC = re.compile(r"^(?:0(?P<width>[1-9][0-9]*))?d?$", re.ASCII)


def _period_start(local: date, period: str) -> date:
    if period == "day":
        return date(local.year, local.month, local.day)
    if period == "month":
        return date(local.year, local.month, 1)
    return date(local.year, 1, 1)


def _next_period(start: date, period: str) -> date:
    if period == "day":
        return start + timedelta(days=1)
    if period == "month":
        return date(start.year + start.month // 12, start.month % 12 + 1, 1)
    return date(start.year + 1, 1, 1)


def _earliest_midnight(day: date, zone: tzinfo) -> float:
    """The earliest instant ``day`` may begin in ``zone`` (a timestamp), whatever DST does.

    Local midnight may not exist (a gap) or happen twice (a fold); the
    earlier reading of the two is never after the real start of the day.
    """
    return min(
        datetime(day.year, day.month, day.day, tzinfo=zone, fold=fold).timestamp()
        for fold in (0, 1)
    )


def _missing_parts(period: str, shown: set[str]) -> list[str]:
    """The parts of a date the period needs that ``shown`` lacks (empty: serials never repeat).

    A day of the year (``%j``) with the year names a day, and so a month too.
    """
    missing = [] if "year" in shown else ["year"]
    if period in ("day", "month") and not shown & {"month", "yday"}:
        missing.append("month")
    if period == "day" and "yday" not in shown and "day" not in shown:
        missing.append("day")
    return missing


class _Template:
    """A validated serial template: how to format it per period and how to parse it."""

    def __init__(self, template: object, period: str | None) -> None:
        if not isinstance(template, str):
            raise InvalidSequenceConfig(
                f"serial template must be a str, got {type(template).__name__} {template!r}"
            )
        self.text = template
        #: ("lit", text), ("n", spec) or ("date", directive letter), in order.
        self.pieces: list[tuple[str, str]] = []
        self.width: int | None = None
        self.n_spec: str | None = None
        self.has_date = False
        for literal, field, spec, conversion in self._fields():
            if literal:
                self.pieces.append(("lit", literal))
            if field is not None:
                self._field(field, spec or "", conversion)
        self._check_shape(period)
        self.pattern = re.compile(
            "".join(
                self._regex(index, kind, text) for index, (kind, text) in enumerate(self.pieces)
            ),
            re.ASCII,
        )

    def _fields(self) -> list[tuple[str, str | None, str | None, str | None]]:
        try:
            return list(string.Formatter().parse(self.text))
        except ValueError as exc:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} is not a valid str.format template ({exc}); "
                "write a literal brace as {{ or }}"
            ) from None

    def _field(self, field: str, spec: str, conversion: str | None) -> None:
        if field not in ("n", "date"):
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} uses {{{field}}}; only {{n}} (the counter) "
                "and {date} (the period's date) are available"
            )
        if conversion:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r}: {{{field}!{conversion}}} converts the value "
                f"to text; drop the !{conversion}"
            )
        if "{" in spec:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r}: nested fields in a format spec are not "
                "supported; write the spec literally"
            )
        if field == "date":
            self._add_date(spec or "%Y-%m-%d")  # str(date) is the ISO date
            return
        if self.n_spec is not None:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} uses {{n}} twice; use it once"
            )
        self._check_n(spec)
        self.pieces.append(("n", spec))

    def _check_n(self, spec: str) -> None:
        match = _N_SPEC.match(spec)
        if match is None:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r}: {{n:{spec}}} is not supported; use {{n}}, "
                "{n:d} or a zero-padded fixed width such as {n:06d}"
            )
        self.n_spec = spec
        if match["width"]:
            self.width = int(match["width"])
            if 10**self.width - 1 > MAX_VALUE:
                raise InvalidSequenceConfig(
                    f"serial template {self.text!r}: {{n:{spec}}} is wider than a 64-bit "
                    "counter can fill; use a width of 18 digits or fewer"
                )

    def _add_date(self, spec: str) -> None:
        self.has_date = True
        written = _DIRECTIVE.sub(lambda m: _EXPANSIONS.get(m[1], m[0]), spec)
        for index, part in enumerate(_DIRECTIVE.split(written)):
            if index % 2 == 0:
                if part:
                    self.pieces.append(("lit", part))
                continue
            if part not in _DIRECTIVES:
                raise InvalidSequenceConfig(
                    f"serial template {self.text!r}: %{part} is not allowed in "
                    f"{{date:{spec}}}: {_REFUSED.get(part, _UNKNOWN)}"
                )
            self.pieces.append(("date", part))

    def _check_shape(self, period: str | None) -> None:
        has_date = self.has_date
        if self.n_spec is None:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} has no {{n}}; put the counter in it, "
                "e.g. 'INV-{n:05d}'"
            )
        if period is None and has_date:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} uses {{date}} but period is None; "
                "give period='day', 'month' or 'year'"
            )
        if period is None:
            return
        shown = {_DIRECTIVES[text].shows for kind, text in self.pieces if kind == "date"}
        missing = _missing_parts(period, shown)
        example = f"{{date:{_KEY_FORMAT[period].replace('-', '')}}}"
        if not has_date:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r} with period={period!r} has no {{date}}: the "
                f"counter restarts each period, so serials would repeat; add e.g. {example}"
            )
        if missing:
            raise InvalidSequenceConfig(
                f"serial template {self.text!r}: its {{date}} does not show "
                + " and ".join(_PART_HINT[part] for part in missing)
                + f", so serials of different {period}s would repeat; use e.g. {example}"
                + (" or {date:%Y%j}" if period == "day" else "")
            )

    def _regex(self, index: int, kind: str, text: str) -> str:
        if kind == "lit":
            return re.escape(text)
        if kind == "date":
            return f"(?P<d{index}>{_DIRECTIVES[text].regex})"
        if self.width:
            return f"(?P<n>[0-9]{{{self.width}}})"
        return f"(?P<n>0|[1-9][0-9]{{0,{len(str(MAX_VALUE)) - 1}}})"

    @property
    def end(self) -> int:
        """The largest counter the template shows (``10**W - 1`` for ``{n:0Wd}``)."""
        return 10**self.width - 1 if self.width else MAX_VALUE

    def date_fields(self, match: re.Match[str]) -> dict[str, str]:
        """What each directive of a matched text shows, by directive letter."""
        return {
            text: match[f"d{index}"]
            for index, (kind, text) in enumerate(self.pieces)
            if kind == "date"
        }

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
                out.append(_DIRECTIVES[text].render(day).replace("{", "{{").replace("}", "}}"))
        return "".join(out)

    @property
    def max_length(self) -> int:
        """The longest serial this template makes (a fixed width, or a 19-digit counter)."""
        total = 0
        for kind, text in self.pieces:
            if kind == "lit":
                total += len(text)
            elif kind == "n":
                total += self.width or len(str(MAX_VALUE))
            else:
                total += _DIRECTIVES[text].width
        return total


def template_length(template: str, period: str | None) -> int:
    """The longest serial ``template`` makes with ``period`` (a string column's length).

    Refuses what [`Serial`][autoseq.serial.Serial] refuses (``InvalidSequenceConfig``).
    """
    return _Template(template, period).max_length


class Serial:
    """Formatted serial numbers of one name, ``next()`` -> ``"INV-2026-00042"``.

    ``store`` is any store or a [`SequenceRegistry`][autoseq.registry.SequenceRegistry]. ``clock``
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
        end = self.template.end
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
        # Asked once: the store's type decides, and a take stays one call.
        self._gapless_engine = _gapless_module(self.store, name) if self.gapless else None
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
        # The period seen last and a span of time known to lie in it,
        # [_since, _until) as timestamps: inside it the clock is not converted.
        self._since = 0.0
        self._until = 0.0
        self._seen: date | None = None
        # What next() may serve without the guard: (since, until, lock, format)
        # of the period seen last, replaced as one so a reader sees one period.
        self._current: tuple[float, float, SequenceLock | None, Callable[..., str]] = (
            0.0,
            0.0,
            None,
            str.format,
        )

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
        return _period_start(self._aware(self.clock()).astimezone(self.tz), self.period)

    def _aware(self, now: object) -> datetime:
        if not isinstance(now, datetime) or now.tzinfo is None:
            raise InvalidSequenceConfig(
                f"serial {self.name!r}: the clock returned {now!r}; it must return an aware "
                "datetime, e.g. datetime.now(UTC)"
            )
        return now

    def _period_now(self) -> date | None:
        """`_now`, converting the clock only when the period may have changed (guard held).

        The default clock is read as a float; a time inside the span known
        to lie in the period seen last is that period. A time before the
        span (a clock set back) or past its end is converted in full.
        """
        period = self.period
        if period is None:
            self._since, self._until = -math.inf, math.inf
            return None
        clock = self.clock
        now = None
        if clock is utc_now:
            stamp = time.time()
        else:
            now = self._aware(clock())
            stamp = now.timestamp()
        if self._since <= stamp < self._until:
            return self._seen
        if now is None:
            now = datetime.fromtimestamp(stamp, UTC)
        day = _period_start(now.astimezone(self.tz), period)
        self._since = stamp
        self._until = _earliest_midnight(_next_period(day, period), self.tz)
        self._seen = day
        return day

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

    def _take(self, count: int) -> tuple[Callable[..., str], list[int]]:
        """``count`` values of the period now, and its formatter; switches period if needed."""
        for _attempt in range(3):
            with self._guard:
                day = self._period_now()
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
                self._current = (self._since, self._until, lock, self._format)
                return self._format, values
        raise AutoseqError(f"serial {self.name!r}: its sequence lock kept being closed")

    def next(self, connection: Any = None) -> str:
        """The next serial; with ``gapless=True``, taken in ``connection``'s transaction.

        Within the span of time known to lie in the current period, the
        value comes straight from the period's lock, without the guard.
        """
        since, until, lock, fmt = self._current
        if lock is not None:
            clock = self.clock
            stamp = time.time() if clock is utc_now else self._aware(clock()).timestamp()
            if since <= stamp < until:
                try:
                    return fmt(n=lock.next())
                except AutoseqError:
                    if not lock._closed:
                        raise
                    # Switched away meanwhile: the guarded path registers again.
        if self.gapless:
            return self._next_gapless(connection, 1)[0]
        fmt, values = self._take(1)
        return fmt(n=values[0])

    def next_many(self, n: int, connection: Any = None) -> list[str]:
        """``n`` serials of one period, in the order taken."""
        check_many(n)  # before any row is created
        if self.gapless:
            return self._next_gapless(connection, n) if n else []
        if not n:
            return []
        fmt, values = self._take(n)
        return [fmt(n=value) for value in values]

    def _next_gapless(self, connection: Any, count: int) -> list[str]:
        day = self._now()
        config = self.row_config(day)
        engine = self._gapless_engine or _gapless_module(self.store, self.name)
        values = engine.take(connection, self.store, config, count)
        fmt = self._formatter(day)
        return [fmt(n=value) for value in values]

    def format(self, counter: int, day: date | None = None) -> str:
        """The serial of ``counter`` in the period starting on ``day`` (no value is taken)."""
        return self._formatter(day)(n=counter)

    def parse(self, text: str) -> tuple[str | None, int]:
        """``(period key, counter)`` of a serial this template makes; ``InvalidSerial`` else.

        Exact: a text is read only if formatting what it reads gives the same
        text back, so two texts never read as the same serial.
        """
        match = self.template.pattern.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r} (template {self.template.text!r}): "
                "its shape differs (ASCII digits only, the counter without leading zeros "
                "beyond its width, month and day names as in 'Nov' and 'November')"
            )
        counter = int(match["n"])
        if counter > self.template.end:
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r}: its counter {counter} is past "
                f"{self.template.end}, the largest the template makes"
            )
        day = self._read_day(text, self.template.date_fields(match))
        made = self.format(counter, day)
        if made != text:
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r}: its counter and date read as "
                f"{made!r}, which is what the template makes of them (a date whose parts "
                "disagree, or one that is not a period's first day)"
            )
        return self.period_key(day), counter

    def _read_day(self, text: str, fields: dict[str, str]) -> date | None:
        """The first day of the period ``fields`` show (None without a period)."""
        if self.period is None:
            return None
        year = int(fields["Y"]) if "Y" in fields else self._century(int(fields["y"]))
        month = fields.get("m") or fields.get("B") or fields.get("b") or fields.get("h")
        dom = fields.get("d") or fields.get("e")
        try:
            if "j" in fields and (month is None or dom is None):
                day = date(year, 1, 1) + timedelta(days=int(fields["j"]) - 1)
            else:
                day = date(year, _month_number(month), int(dom or 1))
        except (ValueError, OverflowError):
            raise InvalidSerial(
                f"{text!r} is not a serial of {self.name!r}: its date parts {fields} name "
                "no day of the calendar"
            ) from None
        return _period_start(day, self.period)

    def _century(self, two_digits: int) -> int:
        """The latest year ending in ``two_digits``, up to next year (by the serial's clock)."""
        now = self._now()
        assert now is not None
        latest = now.year + 1
        return latest - (latest - two_digits) % 100

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


@dataclass(frozen=True)
class SerialOptions:
    """A serial's settings but its store and name: what an ORM's serial field declares.

    The integrations' serial fields keep one and make their
    [`Serial`][autoseq.serial.Serial] with ``build`` for each registry they
    serve; ``check`` raises what ``Serial`` would refuse, where the field
    is declared.
    """

    template: str
    period: str | None = None
    tz: str | tzinfo = "UTC"
    start: int = 1
    step: int = 1
    batch_count: int = 100
    gapless: bool = False
    cycle: bool = False
    clock: Callable[[], datetime] | None = None

    def build(
        self,
        store: SequenceStore | SequenceRegistry,
        name: str,
        *,
        gapless: bool | None = None,
    ) -> Serial:
        """The serial ``name`` on ``store`` with these settings (``gapless`` overrides)."""
        return Serial(
            store,
            name,
            self.template,
            period=self.period,
            tz=self.tz,
            start=self.start,
            step=self.step,
            batch_count=self.batch_count,
            gapless=self.gapless if gapless is None else gapless,
            cycle=self.cycle,
            clock=self.clock,
        )

    def check(self, name: str) -> Serial:
        """A throwaway serial ``name`` on a memory store: raises ``InvalidSequenceConfig``
        where the settings (gapless aside, which needs a SQL store) are refused."""
        return self.build(MemoryStore(), name, gapless=False)


def _gapless_module(store: object, name: str) -> GaplessEngine:
    """The engine taking gapless values on ``store``, or ``GaplessUnavailable``.

    Asked of the store ([`GaplessNumbering`][autoseq.stores.capabilities.GaplessNumbering]),
    so neither SQLAlchemy nor pymongo is imported for a store that does not
    already use it, and a subclass of a store keeps the capability.
    """
    if isinstance(store, GaplessNumbering):
        return store.gapless_engine()
    raise GaplessUnavailable(
        f"sequence {name!r}: gapless=True needs a SQLStore or a MongoStore, got "
        f"{type(store).__name__}: a gapless value is taken in the caller's transaction so a "
        "rollback gives it back, and this store has no such transaction; use gapless=False "
        "(blocks, gaps possible) or a SQL database"
    )


def _month_number(month: str | None) -> int:
    """A month read from a serial as a number: ``"11"``, ``"Nov"`` or ``"November"`` is 11."""
    if month is None:
        return 1
    if month.isdigit():
        return int(month)
    return next(number for number, name in enumerate(_MONTHS, 1) if name.startswith(month))


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
