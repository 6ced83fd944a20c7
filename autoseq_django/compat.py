"""``get_next_value`` and ``get_next_values`` with the signatures of django-sequences.

Code written for django-sequences keeps its calls: ``get_next_value("invoices")``,
``initial_value``, ``reset_value``, ``using``. The values come from autoseq's
blocks (the row named ``sequence_name`` in ``sys_sequence``), so they are
unique and increasing, and a rollback or a process exit skips values.
``gapless=True`` gives django-sequences' own semantics: each value is taken
in the caller's ``atomic()`` block, holding the row's lock until it ends, so
a rollback gives the number back and committed values have no gap.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

from autoseq import InvalidSequenceConfig, SequenceConfig, SequenceLock
from autoseq_django import conf, sequences

_configs: dict[tuple[str, int, int | None], tuple[conf.AutoseqSettings, SequenceConfig]] = {}


def _config(name: str, initial_value: int, reset_value: int | None) -> SequenceConfig:
    settings = conf.get()
    key = (name, initial_value, reset_value)
    cached = _configs.get(key)
    if cached is None or cached[0] is not settings:
        if len(_configs) > 1024:
            _configs.clear()
        cached = _configs[key] = (settings, _build(settings, name, initial_value, reset_value))
    return cached[1]


def _build(
    settings: conf.AutoseqSettings, name: str, initial_value: int, reset_value: int | None
) -> SequenceConfig:
    if reset_value is None:
        return settings.sequence_config(name, start=initial_value)
    if not isinstance(reset_value, int) or reset_value <= initial_value:
        raise InvalidSequenceConfig(
            f"sequence {name!r}: reset_value={reset_value!r} must be an int greater than "
            f"initial_value={initial_value!r}"
        )
    # django-sequences goes back to initial_value on reaching reset_value.
    return settings.sequence_config(name, start=initial_value, end=reset_value - 1, cycle=True)


def _lock(
    sequence_name: str, initial_value: int, reset_value: int | None, using: str | None
) -> SequenceLock:
    config = _config(sequence_name, initial_value, reset_value)
    return sequences.lock(config, using or DEFAULT_DB_ALIAS)


def get_next_value(
    sequence_name: str = "default",
    initial_value: int = 1,
    reset_value: int | None = None,
    *,
    nowait: bool = False,
    using: str | None = None,
    gapless: bool = False,
) -> int:
    """The next value of ``sequence_name``, created at ``initial_value`` on first use.

    With ``reset_value`` the sequence goes back to ``initial_value`` when it
    would reach ``reset_value``. ``using`` is the database whose sequences
    serve it (``AUTOSEQ["DATABASE"]`` and routers apply, as for fields).
    ``nowait`` is accepted for django-sequences' callers: a reservation never
    waits for the caller's row locks. A stored row wins over the arguments.
    ``gapless=True`` takes the value in the caller's ``atomic()`` block
    (``GaplessUnavailable`` outside one), as django-sequences does.
    """
    if gapless:
        return _gapless(sequence_name, initial_value, reset_value, using, 1)[0]
    return _lock(sequence_name, initial_value, reset_value, using).next()


def get_next_values(
    batch_size: int,
    sequence_name: str = "default",
    initial_value: int = 1,
    reset_value: int | None = None,
    *,
    nowait: bool = False,
    using: str | None = None,
    gapless: bool = False,
) -> list[int]:
    """``batch_size`` values of ``sequence_name`` in increasing order (one reservation at most).

    django-sequences returns a ``range``; these values are a list because a
    batch that starts in one block and ends in the next need not be
    contiguous. ``gapless=True``: consecutive values taken in the caller's
    ``atomic()`` block.
    """
    if gapless:
        return _gapless(sequence_name, initial_value, reset_value, using, batch_size)
    return _lock(sequence_name, initial_value, reset_value, using).next_many(batch_size)


def _gapless(
    sequence_name: str,
    initial_value: int,
    reset_value: int | None,
    using: str | None,
    count: int,
) -> list[int]:
    from autoseq_django.serials import take_gapless_values

    config = _config(sequence_name, initial_value, reset_value)
    return take_gapless_values(config, connections[using or DEFAULT_DB_ALIAS], count)
