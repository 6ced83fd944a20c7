"""``SequenceConfig``: one sequence's settings, i.e. one ``sys_sequence`` row."""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from autoseq.errors import InvalidSequenceConfig, InvalidStoredRow

#: Largest value a signed 64-bit column holds (BIGINT, int64 in BSON).
MAX_VALUE = 2**63 - 1
#: Longest sequence name; the ``name`` column is ``VARCHAR(NAME_MAX_LENGTH)``.
NAME_MAX_LENGTH = 191  # fits a utf8mb4 index prefix on MySQL/MariaDB
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def utc_now() -> datetime:
    """Now, timezone-aware in UTC: what every store writes to ``updated_at``."""
    return datetime.now(UTC)


def validate_name(name: object) -> str:
    """Return ``name`` if it can name a sequence, else raise ``InvalidSequenceConfig``.

    Names are data, never code: every store passes them as bound parameters,
    so quotes, ``;`` or ``$`` are allowed. What is refused is what no store
    can key on: non-strings, empty or over-long names, control characters.
    """
    if not isinstance(name, str):
        raise InvalidSequenceConfig(
            f"sequence name must be a str, got {type(name).__name__} {name!r}"
        )
    if not name or name != name.strip():
        raise InvalidSequenceConfig(
            f"sequence name {name!r} must be non-empty and have no leading or trailing spaces"
        )
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidSequenceConfig(
            f"sequence name is {len(name)} characters long; the limit is {NAME_MAX_LENGTH}"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSequenceConfig(
            f"sequence name {name!r} is not valid Unicode text (a lone surrogate); "
            "use printable text"
        ) from None
    if _CONTROL.search(name):
        raise InvalidSequenceConfig(
            f"sequence name {name!r} contains a control character; use printable text"
        )
    return name


def _check_int(field_name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSequenceConfig(
            f"{field_name} must be an int, got {type(value).__name__} {value!r}",
            setting=field_name,
            rule="type",
        )
    if not -MAX_VALUE - 1 <= value <= MAX_VALUE:
        raise InvalidSequenceConfig(
            f"{field_name}={value} does not fit a signed 64-bit integer",
            setting=field_name,
            rule="size",
        )
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting of a sequence a user chooses: the single declaration of it.

    ``SequenceConfig`` takes its default and checks it by ``type`` and
    ``minimum``; the CLIs build their options from it (``option``, ``help``),
    Django's ``AUTOSEQ["DEFAULTS"]`` and the ORM fields accept these names.
    """

    name: str
    type: type[int] | type[bool]
    default: int | bool
    help: str
    #: The smallest value allowed, and what the error adds to say what to do.
    minimum: int | None = None
    minimum_hint: str = ""
    #: How help shows the default, where ``str(default)`` reads badly.
    default_text: str | None = None
    #: Whether a stored row's setting can be changed (``start`` is fixed once values exist).
    changeable: bool = True

    @property
    def option(self) -> str:
        """The command-line option: ``--batch-count`` for ``batch_count``."""
        return "--" + self.name.replace("_", "-")

    def describe_default(self) -> str:
        """The default as help shows it: ``1``, ``2**63-1``, ``yes``."""
        if self.default_text is not None:
            return self.default_text
        if self.type is bool:
            return "yes" if self.default else "no"
        return str(self.default)


#: The settings of a sequence, in ``sys_sequence`` column order.
SETTINGS: tuple[Setting, ...] = (
    Setting("start", int, 1, "first value", changeable=False),
    Setting("end", int, MAX_VALUE, "last value", default_text="2**63-1"),
    Setting("step", int, 1, "increment", minimum=1),
    Setting("batch", bool, True, "reserve batch_count values per round trip (else one)"),
    Setting(
        "batch_count",
        int,
        100,
        "values per reservation",
        minimum=1,
        minimum_hint=" (use batch=False for one value per round trip)",
    ),
    Setting("cycle", bool, False, "wrap from end back to start instead of failing"),
)
#: The setting names, in order: ``("start", "end", "step", "batch", "batch_count", "cycle")``.
SETTING_NAMES: tuple[str, ...] = tuple(setting.name for setting in SETTINGS)
SETTINGS_BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}
# Precompiled for SequenceConfig's fast path: (name, lowest allowed) of each int
# setting and the names of the bool ones.
_INT_FLOORS: tuple[tuple[str, int], ...] = tuple(
    (s.name, -MAX_VALUE - 1 if s.minimum is None else max(s.minimum, -MAX_VALUE - 1))
    for s in SETTINGS
    if s.type is int
)
_BOOLS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.type is bool)
#: The settings a change to a stored row may write.
CHANGEABLE_SETTINGS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.changeable)


def _int_default(name: str) -> int:
    default = SETTINGS_BY_NAME[name].default
    assert type(default) is int
    return default


def _bool_default(name: str) -> bool:
    default = SETTINGS_BY_NAME[name].default
    assert type(default) is bool
    return default


def stored_int(value: object, field_name: str) -> int:
    # Drivers hand back integers as int (bson's Int64 is one); a float is
    # refused even when whole, since a shell that wrote 1e20 lost precision.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidSequenceConfig(
        f"{field_name} must be an integer, got {type(value).__name__} {value!r}"
    )


def stored_bool(value: object, field_name: str) -> bool:
    # SQL drivers return booleans as bool or 0/1 (MySQL TINYINT); anything
    # else (the string "false", 2, None) is a hand edit we must not guess.
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidSequenceConfig(
        f"{field_name} must be true/false (or 1/0), got {type(value).__name__} {value!r}"
    )


@dataclass(frozen=True, slots=True)
class SequenceConfig:
    """Settings of one named sequence; also the shape of a ``sys_sequence`` row.

    ``current`` is the next value nobody has reserved yet (``None`` means
    ``start``). Values are ``start, start + step, ...`` up to ``end``; with
    ``batch=True`` each reservation takes ``batch_count`` values at once.

    ``gapless=True`` declares a sequence whose every value is taken inside
    the caller's transaction, never from a block (docs/serials.md): a
    rollback gives the value back. It is how the caller takes values, not
    part of the stored row, so ``batch`` and ``batch_count`` do not apply
    and a [`SequenceRegistry`][autoseq.registry.SequenceRegistry] refuses to serve it blocks.
    """

    name: str
    start: int = _int_default("start")
    end: int = _int_default("end")
    step: int = _int_default("step")
    current: int | None = None
    batch: bool = _bool_default("batch")
    batch_count: int = _int_default("batch_count")
    cycle: bool = _bool_default("cycle")
    updated_at: datetime | None = field(default=None, compare=False)
    #: Bumped by every write to the stored row (reservation, hand-back, set,
    #: change); the compare-and-set of every write outside a reservation
    #: checks it, so a stale or re-sent write changes nothing.
    version: int = field(default=0, compare=False)
    gapless: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not self._plainly_typed():
            self._check_settings()
        self._check_relations()

    def _plainly_typed(self) -> bool:
        """True when every setting and ``version`` has its exact type, fits and meets
        its minimum: what `_check_settings` checks, in one pass without messages."""
        for name, floor in _INT_FLOORS:
            value = getattr(self, name)
            if type(value) is not int or not floor <= value <= MAX_VALUE:
                return False
        version = self.version
        if type(version) is not int or not -MAX_VALUE - 1 <= version <= MAX_VALUE:
            return False
        return type(self.gapless) is bool and all(
            type(getattr(self, name)) is bool for name in _BOOLS
        )

    def _check_settings(self) -> None:
        """Raise the first type, size or minimum error of the settings, with its message."""
        for setting in SETTINGS:
            if setting.type is int:
                _check_int(setting.name, getattr(self, setting.name))
        _check_int("version", self.version)
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if setting.type is bool and not isinstance(value, bool):
                raise InvalidSequenceConfig(
                    f"{setting.name} must be True or False, got {type(value).__name__} {value!r}",
                    setting=setting.name,
                    rule="type",
                )
        if not isinstance(self.gapless, bool):
            raise InvalidSequenceConfig(
                f"gapless must be True or False, got {type(self.gapless).__name__} "
                f"{self.gapless!r}",
                setting="gapless",
                rule="type",
            )
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            if setting.minimum is not None and value < setting.minimum:
                raise InvalidSequenceConfig(
                    f"sequence {self.name!r}: {setting.name}={value}; {setting.name} must be "
                    f"{setting.minimum} or more{setting.minimum_hint}",
                    setting=setting.name,
                    rule="minimum",
                )

    def _check_relations(self) -> None:
        if self.start > self.end:
            raise InvalidSequenceConfig(
                f"sequence {self.name!r}: start={self.start} is greater than end={self.end}",
                setting="start",
                rule="order",
            )
        if self.start > MAX_VALUE - self.step:
            raise InvalidSequenceConfig(
                f"sequence {self.name!r}: start={self.start} leaves no room for one step "
                f"of {self.step} below 2**63; lower start or step",
                setting="start",
                rule="room",
            )
        if self.current is not None:
            _check_int("current", self.current)
            if not self.start <= self.current <= self.end:
                raise InvalidSequenceConfig(
                    f"sequence {self.name!r}: current={self.current} is outside "
                    f"[start={self.start}, end={self.end}]",
                    setting="current",
                    rule="range",
                )
            if (self.current - self.start) % self.step:
                raise InvalidSequenceConfig(
                    f"sequence {self.name!r}: current={self.current} is not start + k * step "
                    f"(start={self.start}, step={self.step})",
                    setting="current",
                    rule="grid",
                )

    @classmethod
    def from_row(cls, row: Any) -> SequenceConfig:
        """Build from a stored row (mapping), where ``current`` may be past ``end``.

        A row whose ``current`` is one step past its last value is an
        exhausted sequence, a legal state. Parsing is strict: flags must be
        real booleans or 0/1 (never the string ``"false"``), numbers must be
        integers (never a float a shell wrote). Anything else raises
        [`InvalidStoredRow`][autoseq.errors.InvalidStoredRow] naming the row and the command that
        fixes it. A row without ``version`` (written before versions existed) reads as 0.
        """
        get = row.get if hasattr(row, "get") else (lambda k: getattr(row, k, None))
        name: Any = get("name")
        try:
            config = cls(
                name=name,
                start=stored_int(get("start"), "start"),
                end=stored_int(get("end"), "end"),
                step=stored_int(get("step"), "step"),
                batch=stored_bool(get("batch"), "batch"),
                batch_count=stored_int(get("batch_count"), "batch_count"),
                cycle=stored_bool(get("cycle"), "cycle"),
                updated_at=get("updated_at"),
                version=stored_int(get("version") if get("version") is not None else 0, "version"),
            )
            current = stored_int(get("current"), "current")
        except InvalidSequenceConfig as exc:
            raise InvalidStoredRow(name, str(exc)) from None
        if not config.start <= current <= config.last_value + config.step or (
            (current - config.start) % config.step
        ):
            raise InvalidStoredRow(
                name,
                f"current={current} is not start + k * step within [start={config.start}, "
                f"end={config.end}] (step={config.step})",
            )
        object.__setattr__(config, "current", current)
        return config

    @property
    def last_value(self) -> int:
        """The largest value this sequence can hand out.

        The last multiple of ``step`` past ``start`` not above ``end``, and
        never so close to 2**63 that ``current`` could no longer be stored.
        """
        ceiling = min(self.end, MAX_VALUE - self.step)
        return self.start + (ceiling - self.start) // self.step * self.step

    @property
    def exhausted(self) -> bool:
        """True when every value up to ``end`` has been reserved (and no cycle)."""
        return self.next_value > self.last_value

    @property
    def block_size(self) -> int:
        """How many values one reservation takes."""
        return self.batch_count if self.batch else 1

    @property
    def next_value(self) -> int:
        """The next unreserved value (``current``, or ``start`` when unset)."""
        return self.start if self.current is None else self.current

    @property
    def values_left(self) -> int:
        """Values not yet reserved before ``end`` (a cycling sequence starts over after)."""
        return max(0, (self.last_value - self.next_value) // self.step + 1)

    @property
    def range_size(self) -> int:
        """How many values the series ``start, start + step, ...`` holds in all."""
        return (self.last_value - self.start) // self.step + 1

    def first_value_after(self, value: int | None) -> int:
        """The first value of the series (``start + k * step``) greater than ``value``.

        ``None`` (nothing stored yet) or a value below ``start`` gives ``start``.
        The result may lie past ``last_value``: the ``current`` of an exhausted row.
        """
        if value is None or value < self.start:
            return self.start
        return self.start + ((value - self.start) // self.step + 1) * self.step

    def first_value_from(self, value: int) -> int:
        """The first value of the series at or above ``value``."""
        if value <= self.start:
            return self.start
        return self.start + -(-(value - self.start) // self.step) * self.step

    def replace(self, **changes: Any) -> SequenceConfig:
        """A copy with ``changes`` applied and validated again."""
        return dataclasses.replace(self, **changes)

    def with_current(self, current: int, updated_at: datetime | None = None) -> SequenceConfig:
        """A copy with ``current`` set; one step past the last value means exhausted."""
        return SequenceConfig.from_row(
            {**self.as_row(), "current": current, "updated_at": updated_at or self.updated_at}
        )

    def replace_version(self, version: int) -> SequenceConfig:
        """A copy carrying the stored row's ``version`` (rows only, not settings)."""
        return SequenceConfig.from_row(
            {**self.as_row(), "updated_at": self.updated_at, "version": version}
        )

    def as_row(self) -> dict[str, Any]:
        """The ``sys_sequence`` row for this config (``current`` filled in)."""
        return {
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "step": self.step,
            "current": self.next_value,
            "batch": self.batch,
            "batch_count": self.batch_count,
            "cycle": self.cycle,
            "version": self.version,
        }


#: The columns of a stored row as `configs_from_values` and `plainly_valid` read
#: it, in ``sys_sequence`` order.
ROW_COLUMNS: tuple[str, ...] = (
    "name",
    "start",
    "end",
    "step",
    "current",
    "batch",
    "batch_count",
    "cycle",
    "updated_at",
    "version",
)
_LOWEST = -MAX_VALUE - 1
_new = object.__new__
(
    _set_name,
    _set_start,
    _set_end,
    _set_step,
    _set_current,
    _set_batch,
    _set_batch_count,
    _set_cycle,
    _set_updated_at,
    _set_version,
    _set_gapless,
) = (SequenceConfig.__dict__[column].__set__ for column in (*ROW_COLUMNS, "gapless"))


def _build(row: Sequence[Any]) -> SequenceConfig:
    """The config of a row already found plainly valid (no check repeated)."""
    config = _new(SequenceConfig)
    _set_name(config, row[0])
    _set_start(config, row[1])
    _set_end(config, row[2])
    _set_step(config, row[3])
    _set_current(config, row[4])
    _set_batch(config, row[5] == 1)
    _set_batch_count(config, row[6])
    _set_cycle(config, row[7] == 1)
    _set_updated_at(config, row[8])
    _set_version(config, row[9])
    _set_gapless(config, False)
    return config


def plainly_valid(rows: Sequence[Any]) -> bool:
    """Whether every row (a tuple in `ROW_COLUMNS` order) plainly passes ``from_row``.

    Checked column by column with C-level passes (``map``, ``min``, ``max``),
    about a tenth of ``from_row``'s cost: exact ints within 64 bits, flags
    True/False or 0/1, ``version`` present, ASCII printable names with no
    edge spaces, ``step`` and ``batch_count`` of 1 or more, ``start <= end``,
    room for one step, and ``current`` on the grid from ``start`` up to one
    step past the last value. False says only "look row by row"
    (`configs_from_values`), which accepts the row or names what is wrong.
    """
    if not rows:
        return True
    names, starts, ends, steps, currents, batches, counts, cycles, _, versions = zip(
        *rows, strict=True
    )
    if set(map(type, names)) != {str}:
        return False
    # One string for the character checks: no name holds a newline (count),
    # so a name is empty, or starts or ends with a space, only where a
    # separator touches another or a space, or at either end.
    joined = "\n".join(names)
    if not (
        joined
        and joined.isascii()
        and joined.count("\n") == len(names) - 1
        and joined.replace("\n", "").isprintable()
        and joined[0] not in " \n"
        and joined[-1] not in " \n"
        and "\n\n" not in joined
        and " \n" not in joined
        and "\n " not in joined
        and max(map(len, names)) <= NAME_MAX_LENGTH
    ):
        return False
    numbers = (starts, ends, steps, currents, counts, versions)
    if (
        set(map(type, chain.from_iterable(numbers))) != {int}
        or min(map(min, numbers)) < _LOWEST
        or max(map(max, numbers)) > MAX_VALUE
    ):
        return False
    flags = (*batches, *cycles)
    if not set(map(type, flags)) <= {bool, int} or not set(flags) <= {0, 1}:
        return False
    widest = max(steps)
    return (
        min(steps) >= 1
        and min(counts) >= 1
        and all(map(operator.le, starts, ends))
        # room for one step (stricter than row by row, which a False leaves to)
        and max(starts) <= MAX_VALUE - widest
        and all(map(operator.le, starts, currents))
        # on the grid (every current is, when every step is 1)
        and (widest == 1 or not any(map(operator.mod, map(operator.sub, currents, starts), steps)))
        # current <= last_value + step, for a current on the grid from start
        and all(map(operator.le, map(operator.sub, currents, steps), ends))
    )


def config_from_values(row: Any) -> SequenceConfig:
    """``SequenceConfig.from_row`` of one stored row, a tuple in `ROW_COLUMNS` order."""
    return configs_from_values((row,))[0]


def configs_from_values(rows: Iterable[Any]) -> list[SequenceConfig]:
    """``SequenceConfig.from_row`` of many stored rows, each a tuple in `ROW_COLUMNS` order.

    What ``read_all()`` runs on thousands of rows (issue 34): a row whose
    every value plainly passes (the tests of `plainly_valid`, row by row)
    is built with no per-field checks; any other row goes through
    ``from_row``, which accepts it or raises its ``InvalidStoredRow`` naming
    the row and the fix. Never more lenient than ``from_row``.
    """
    out: list[SequenceConfig] = []
    append = out.append
    for row in rows:
        name, start, end, step, current, batch, batch_count, cycle, _, version = row
        if (
            type(name) is str
            and 0 < len(name) <= NAME_MAX_LENGTH
            and name.isascii()
            and name.isprintable()
            and name == name.strip()
            and type(start) is int
            and type(end) is int
            and type(step) is int
            and type(current) is int
            and type(batch_count) is int
            and type(version) is int
            and (batch is True or batch is False or (type(batch) is int and 0 <= batch <= 1))
            and (cycle is True or cycle is False or (type(cycle) is int and 0 <= cycle <= 1))
            and 1 <= step <= MAX_VALUE
            and 1 <= batch_count <= MAX_VALUE
            and _LOWEST <= start <= end <= MAX_VALUE
            and start <= MAX_VALUE - step
            and _LOWEST <= version <= MAX_VALUE
            and start <= current <= MAX_VALUE
            and not (current - start) % step
            and current - step <= end
        ):
            append(_build(row))
        else:
            append(SequenceConfig.from_row(dict(zip(ROW_COLUMNS, row, strict=True))))
    return out
