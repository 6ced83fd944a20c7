"""Moving a sequence outside a reservation: set, sync, change, repair, adopt.

Every caller (the ``autoseq`` command line, the Django admin and
``manage.py autoseq``, mongoengine's ``set_next_value`` and adoption) goes
through this module, and this module writes only through the store's
`compare_and_set`. So each write:

* applies only to the row version it was decided on: a reservation, a
  hand-back or another operator's change landing in between makes it miss,
  and the decision is taken again on the fresh row;
* is safe to send twice: a client that re-sends it after a lost reply finds
  the next version and changes nothing (and `_write` recognises its
  own write when it reads the row back);
* moves ``current`` forward only, unless the operator forces it, and never
  to or below a floor (``max()`` of a column using the sequence) it is given.

Processes that hold blocks reserved before a change keep serving them:
their values were taken from the store, so no one else gets them. Their
hand-back on exit then finds a newer version and does nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from autoseq.config import (
    CHANGEABLE_SETTINGS,
    MAX_VALUE,
    SequenceConfig,
    stored_bool,
    stored_int,
    validate_name,
)
from autoseq.errors import (
    InvalidSequenceConfig,
    InvalidStoredRow,
    ReservationConflict,
    SequenceNotFound,
    ValueMovesBackward,
)
from autoseq.stores.base import SequenceStore
from autoseq.stores.capabilities import ReadsRawRows

#: Settings a maintenance write may change (``start`` and ``name`` are fixed).
CHANGEABLE = ("current", *CHANGEABLE_SETTINGS)
_ATTEMPTS = 50
#: How long a maintenance write keeps trying on a sequence that keeps moving.
WRITE_TIMEOUT = 10.0


def first_value_after(row: SequenceConfig, value: int | None) -> int:
    """The first value of ``row``'s series greater than ``value``: ``row.first_value_after``."""
    return row.first_value_after(value)


def first_value_from(row: SequenceConfig, value: int) -> int:
    """The first value of ``row``'s series at or above ``value``: ``row.first_value_from``."""
    return row.first_value_from(value)


def read(store: SequenceStore, name: str) -> SequenceConfig:
    """The stored row of ``name``; ``SequenceNotFound`` when there is none."""
    row = store.read(validate_name(name))
    if row is None:
        raise SequenceNotFound(name, f"create it first: `autoseq create {name}`")
    return row


def _stored(row: SequenceConfig, current: int) -> SequenceConfig:
    """``row`` with ``current`` (one step past the last value allowed), validated."""
    return row.with_current(current)


def _write(
    store: SequenceStore,
    name: str,
    decide: Callable[[SequenceConfig], SequenceConfig | None],
) -> SequenceConfig:
    """Read, decide, compare-and-set; again on a miss. ``decide`` returns None for no change.

    On a busy sequence every reservation bumps the version, so a write can
    miss many times in a row; a jittered back-off lets it land in a gap
    between reservations, and the loop gives up after ``WRITE_TIMEOUT``.
    """
    deadline = time.monotonic() + WRITE_TIMEOUT
    attempts = 0
    while attempts < _ATTEMPTS or time.monotonic() < deadline:
        if attempts:
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempts)))
        attempts += 1
        row = read(store, name)
        wanted = decide(row)
        if wanted is None:
            return row
        written = store.compare_and_set(wanted, row.version)
        if written is not None:
            return written
        # A miss is someone else's write, or our own whose reply was lost and
        # the driver re-sent: then the row is exactly what we wrote.
        now = store.read(name)
        if now is not None and now.version == row.version + 1 and _same(now, wanted):
            return now
    raise ReservationConflict(
        f"sequence {name!r} kept changing while being written ({attempts} attempts in "
        f"{WRITE_TIMEOUT:g} s); try again when it is quieter",
        name=name,
    )


def _same(a: SequenceConfig, b: SequenceConfig) -> bool:
    return a.as_row() | {"version": 0} == b.as_row() | {"version": 0}


def _check_floor(row: SequenceConfig, value: int, floor: int | None) -> None:
    if floor is not None and value <= floor:
        raise ValueMovesBackward(
            f"sequence {row.name!r}: {value} is not past {floor}, the largest value already "
            f"stored in a column using it; use {row.first_value_after(floor)} or more"
        )


def set_current(
    store: SequenceStore,
    name: str,
    value: int,
    *,
    force: bool = False,
    floor: int | None = None,
) -> SequenceConfig:
    """Make ``value`` the next value ``name`` hands out.

    Forward only: a value behind the stored ``current`` raises
    [`ValueMovesBackward`][autoseq.errors.ValueMovesBackward] unless ``force`` (running processes
    may hold the values below it). ``floor`` (``max()`` of the columns using the
    sequence) is a hard limit, even when forced. A row that fails validation
    (edited by hand) can only be repaired with ``force``: see
    [`repair`][autoseq.maintenance.repair].
    """
    _check_int("value", value)

    def decide(row: SequenceConfig) -> SequenceConfig | None:
        _on_grid(row, value)
        if value == row.next_value:
            return None
        if value < row.next_value and not force:
            raise ValueMovesBackward(
                f"sequence {row.name!r}: current may only move forward; {value} is behind "
                f"the next value {row.next_value} and values up to there may be in use. "
                "Stop every process using it and pass "
                f"--force (`autoseq set {row.name} {value} --force`) if you know they are not"
            )
        _check_floor(row, value, floor)
        return _stored(row, value)

    try:
        return _write(store, name, decide)
    except InvalidStoredRow:
        if not force:
            raise
        return repair(store, name, value)


def _check_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSequenceConfig(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not -MAX_VALUE - 1 <= value <= MAX_VALUE:
        raise InvalidSequenceConfig(f"{what}={value} does not fit a signed 64-bit integer")
    return value


def _on_grid(row: SequenceConfig, value: int, *, exhausted_ok: bool = False) -> None:
    """``value`` must be a value ``row`` can hand out (or, if allowed, one step past the last)."""
    if value < row.start:
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: current={value} is outside [start={row.start}, "
            f"end={row.end}]: below start"
        )
    if value > row.last_value + (row.step if exhausted_ok else 0):
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: current={value} is past end={row.end} (outside "
            f"[start={row.start}, end={row.end}]); raise end first"
        )
    if (value - row.start) % row.step:
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: {value} is not start + k * step (start={row.start}, "
            f"step={row.step}); the nearest such value is {row.first_value_from(value)}"
        )


def sync(store: SequenceStore, name: str, floor: int | None) -> SequenceConfig:
    """Move ``current`` past ``floor`` (the largest key in use), never backward.

    ``floor`` None (empty columns) changes nothing. A floor at or past the
    last value raises ``InvalidSequenceConfig`` (raise ``end`` first) unless
    the sequence cycles.
    """

    def decide(row: SequenceConfig) -> SequenceConfig | None:
        target = sync_target(row, floor)
        return None if target is None else _stored(row, target)

    return _write(store, name, decide)


def sync_target(row: SequenceConfig, floor: int | None, holder: str = "a column") -> int | None:
    """The ``current`` that puts ``row`` past ``floor``; None when it is past already.

    ``InvalidSequenceConfig`` when ``floor`` (held by ``holder``) is at or
    past the last value: only a larger ``end`` makes room.
    """
    target = row.first_value_after(floor)
    if target <= row.next_value:
        return None
    if target > row.last_value + row.step:
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: {holder} already holds {floor}, past the last "
            f"value {row.last_value} (end={row.end}); raise its end first"
        )
    return target


def change(
    store: SequenceStore,
    name: str,
    *,
    force: bool = False,
    floor: int | None = None,
    **changes: Any,
) -> SequenceConfig:
    """Change settings of ``name`` (``CHANGEABLE``) so values stay unique.

    * ``current``: as [`set_current`][autoseq.maintenance.set_current] (forward only
      unless ``force``).
    * ``step``: ``current`` moves up to the first value of the new grid at or
      above the stored one, so no value below it (possibly handed out) is
      reachable again and the row stays valid for every process.
    * ``end``: may not fall below the last value handed out
      (``current - step``).
    * ``batch``, ``batch_count``, ``cycle``: written as given.

    Only what is in ``changes`` is compared and written: a form opened
    before a reservation may still change ``batch_count`` alone.
    """
    return _write(store, name, lambda row: planned_change(row, force=force, floor=floor, **changes))


def planned_change(
    row: SequenceConfig, *, force: bool = False, floor: int | None = None, **changes: Any
) -> SequenceConfig | None:
    """The row `change` would write over ``row`` (None: no change); nothing is written.

    Raises ``InvalidSequenceConfig`` (``ValueMovesBackward`` for a backward
    ``current``) saying why the change cannot be made. For forms that check
    a change before applying it.
    """
    unknown = sorted(set(changes) - set(CHANGEABLE))
    if unknown:
        raise InvalidSequenceConfig(
            f"cannot change {', '.join(unknown)}; changeable: {', '.join(CHANGEABLE)}"
        )
    settings = {k: v for k, v in changes.items() if k != "current"}
    try:
        candidate = SequenceConfig(**(row.as_row() | settings | {"current": None}))
    except InvalidSequenceConfig as exc:
        raise InvalidSequenceConfig(f"cannot change sequence {row.name!r}: {exc}") from None
    current = row.next_value
    if "step" in settings and candidate.step != row.step:
        current = candidate.first_value_from(current)
    if changes.get("current") is not None:
        value = _check_int("current", changes["current"])
        if value < current and not force:
            raise ValueMovesBackward(
                f"sequence {row.name!r}: current may only move forward; {value} is behind "
                f"the next value {current} and values up to there may be in use. Stop every "
                "process using it and force the change if you know they are not"
            )
        _on_grid(candidate, value)
        if value != row.next_value:
            _check_floor(candidate, value, floor)
        current = value
    if current > candidate.last_value + candidate.step:
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: current={current} is past end={candidate.end}; "
            f"values up to {current - row.step} may be reserved: use end >= {current - row.step}"
        )
    wanted = _stored(candidate, current)
    return None if _same(wanted, row) else wanted


def repair(store: SequenceStore, name: str, current: int, **overrides: Any) -> SequenceConfig:
    """Rewrite a row that fails validation, keeping every field that is still valid.

    ``current`` is the next value to hand out (pick one past every key in
    use). A field that cannot be read (``cycle`` stored as ``"false"``,
    ``step`` = 0) must be given in ``overrides``; the message names it.
    Still a compare-and-set on the stored version, so a concurrent repair
    or reservation is never overwritten.
    """
    _check_int("current", current)
    if not isinstance(store, ReadsRawRows):
        raise InvalidSequenceConfig(
            f"{type(store).__name__} cannot read a raw row; recreate sequence {name!r}"
        )
    for _ in range(_ATTEMPTS):
        raw: Mapping[str, Any] | None = store.read_raw(validate_name(name))
        if raw is None:
            raise SequenceNotFound(name, f"create it first: `autoseq create {name}`")
        fields: dict[str, Any] = {}
        unreadable: list[str] = []
        for field in ("start", "end", "step", "batch_count"):
            try:
                fields[field] = stored_int(overrides.get(field, raw.get(field)), field)
            except InvalidSequenceConfig:
                unreadable.append(field)
        for field in ("batch", "cycle"):
            try:
                fields[field] = stored_bool(overrides.get(field, raw.get(field)), field)
            except InvalidSequenceConfig:
                unreadable.append(field)
        if unreadable:
            flags = " ".join(f"--{f.replace('_', '-')} VALUE" for f in unreadable)
            raise InvalidStoredRow(
                name,
                f"{', '.join(unreadable)} cannot be read; give them explicitly "
                f"(`autoseq set {name} {current} --force {flags}`)",
            )
        try:
            version = stored_int(raw.get("version") or 0, "version")
        except InvalidSequenceConfig:
            version = -1  # matches nothing: such a row must be fixed by hand
        try:
            row = SequenceConfig(name, **fields)
        except InvalidSequenceConfig as exc:
            raise InvalidStoredRow(
                name,
                f"{exc}; give corrected settings "
                f"(`autoseq set {name} {current} --force --step S --end E ...`)",
            ) from None
        _on_grid(row, current)
        written = store.compare_and_set(_stored(row, current), version)
        if written is not None:
            return written
    raise ReservationConflict(
        f"sequence {name!r} kept changing while being repaired; try again", name=name
    )


def adopt(
    store: SequenceStore, config: SequenceConfig, floor: int | None
) -> tuple[SequenceConfig, bool]:
    """Create ``config``'s row past ``floor`` or move an existing one past it.

    For taking over keys another generator issued (mongoengine's counters,
    a table filled before autoseq). Returns the row and whether it was
    created. Never moves a row backward.
    """
    existing = store.read(config.name)
    if existing is None:
        opening = config
        if floor is not None and floor >= config.next_value:
            opening = _stored(config, config.first_value_after(floor))
        created = store.create(opening)
        if created.next_value == opening.next_value and created.version == 0:
            return created, True
        existing = created  # another process created it first: sync it below
    return sync(store, config.name, floor), False
