"""The ``AUTOSEQ`` setting: one dict, read lazily, checked once, re-read when tests change it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from autoseq import BufferPolicy, InvalidSequenceConfig, SequenceConfig
from autoseq.config import SETTING_NAMES

#: Keys of ``AUTOSEQ``; anything else is a typo and refused.
KEYS = ("DATABASE", "AUTO_CREATE", "DEFAULTS", "BUFFER", "PRELOAD", "URLS")
#: Keys of ``AUTOSEQ["DEFAULTS"]``: the settings of a sequence a field does not set.
DEFAULT_KEYS = SETTING_NAMES


@dataclass(frozen=True)
class AutoseqSettings:
    """``settings.AUTOSEQ`` validated.

    ``database``: the alias holding ``sys_sequence`` for every model (None:
    the database each row is written to, unless a router sends ``SysSequence``
    elsewhere). ``auto_create``: create a missing row from the field's
    arguments (else ``SequenceNotFound``). ``defaults``: sequence settings a
    field leaves out. ``buffer``: the ``BufferPolicy`` of every sequence.
    ``preload``: read every row on the first request instead of on first use.
    ``urls``: SQLAlchemy URLs by alias, for engines autoseq cannot translate.
    """

    database: str | None = None
    auto_create: bool = True
    defaults: dict[str, Any] = field(default_factory=dict)
    buffer: BufferPolicy = field(default_factory=BufferPolicy)
    preload: bool = False
    urls: dict[str, str] = field(default_factory=dict)

    def sequence_config(self, name: str, **given: Any) -> SequenceConfig:
        """The config of sequence ``name``: ``given`` (None = unset) over ``defaults``."""
        values = {**self.defaults, **{k: v for k, v in given.items() if v is not None}}
        return SequenceConfig(name, **values)


def _fail(message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"AUTOSEQ: {message}")


def parse(raw: object) -> AutoseqSettings:
    """Validate a raw ``AUTOSEQ`` value; ``ImproperlyConfigured`` says what to fix."""
    if raw is None:
        return AutoseqSettings()
    if not isinstance(raw, dict):
        raise _fail(f"must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise _fail(
            f"unknown key(s) {', '.join(map(repr, unknown))}; valid keys: {', '.join(KEYS)}"
        )
    database = raw.get("DATABASE")
    if database is not None and database not in settings.DATABASES:
        raise _fail(f"DATABASE={database!r} is not in DATABASES ({', '.join(settings.DATABASES)})")
    auto_create = raw.get("AUTO_CREATE", True)
    preload = raw.get("PRELOAD", False)
    for key, value in (("AUTO_CREATE", auto_create), ("PRELOAD", preload)):
        if not isinstance(value, bool):
            raise _fail(f"{key} must be True or False, got {value!r}")
    defaults = raw.get("DEFAULTS", {})
    if not isinstance(defaults, dict):
        raise _fail(f"DEFAULTS must be a dict, got {type(defaults).__name__}")
    bad = sorted(set(defaults) - set(DEFAULT_KEYS))
    if bad:
        raise _fail(
            f"DEFAULTS has unknown key(s) {', '.join(map(repr, bad))}; "
            f"valid keys: {', '.join(DEFAULT_KEYS)}"
        )
    try:
        SequenceConfig("defaults", **defaults)
    except InvalidSequenceConfig as exc:
        raise _fail(f"DEFAULTS cannot make a sequence: {exc}") from None
    buffer = raw.get("BUFFER", {})
    if not isinstance(buffer, dict):
        raise _fail(f"BUFFER must be a dict of BufferPolicy arguments, got {buffer!r}")
    try:
        policy = BufferPolicy(**buffer)
    except (TypeError, InvalidSequenceConfig) as exc:
        raise _fail(f"BUFFER is not a valid BufferPolicy: {exc}") from None
    urls = raw.get("URLS", {})
    if not isinstance(urls, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in urls.items()
    ):
        raise _fail("URLS must map database aliases to SQLAlchemy URL strings")
    return AutoseqSettings(database, auto_create, dict(defaults), policy, preload, dict(urls))


@functools.cache
def get() -> AutoseqSettings:
    """The current ``AUTOSEQ`` settings (cached until ``reset()``)."""
    return parse(getattr(settings, "AUTOSEQ", None))


def reset() -> None:
    """Forget the cached settings (``setting_changed`` calls this)."""
    get.cache_clear()
