"""autoseq for Django: ordered integer keys from ``sys_sequence``, reserved in blocks.

Quick start::

    INSTALLED_APPS = [..., "autoseq_django"]

    from autoseq_django.fields import SequenceField

    class Order(models.Model):
        id = SequenceField(primary_key=True)                  # sequence "<db_table>"
        ticket_no = SequenceField(sequence="tickets", start=1000, batch_count=200)

then ``manage.py migrate``. Every insert path (``save()``, ``create()``,
``bulk_create()``) gets values when the row is inserted; values you set are
kept. Blocks are reserved in autoseq's own connection and transaction, so a
rollback of yours never hands a value out twice.

Settings, all optional, in one dict::

    AUTOSEQ = {
        "DATABASE": None,     # alias holding sys_sequence for every model; None: the
                              # database each row is written to (or where a router
                              # sends SysSequence)
        "AUTO_CREATE": True,  # create a missing row from the field; False: SequenceNotFound
        "DEFAULTS": {"batch_count": 100},   # start/end/step/batch/batch_count/cycle
        "BUFFER": {},         # autoseq.BufferPolicy arguments (prefetch, block growth...)
        "PRELOAD": False,     # True: load every sequence on the first request
        "URLS": {},           # alias -> SQLAlchemy URL, for engines autoseq cannot map
    }

SQLite: one writer per file. A reservation needed while your
``atomic()`` holds the write lock would wait for it forever, so the sequences
of ``db.sqlite3`` live in the companion file ``db.sqlite3.autoseq`` (an
in-memory database, like the test database, gets a shared-cache in-memory
store). Django's connections attach the companion (a file read-only), so the
admin and ``SysSequence`` queries show those rows with no extra settings,
in tests too. Change rows with the admin or ``manage.py autoseq`` (they
write through autoseq's own connection), not by saving ``SysSequence``
inside your transactions.

``manage.py autoseq list | create | set | change | sync | apply | doctor ...`` manages rows. Keys
loaded with their own values (``loaddata``, explicit bulk loads) and fields a
migration converts move their sequences past them by themselves.
``DEFAULT_AUTO_FIELD = "autoseq_django.fields.SequenceAutoField"`` keys every
model; ``get_next_value(name)``, ``get_last_value``, ``delete`` and ``Sequence``
serve code written for django-sequences from blocks, and
``autoseq_django.django_sequences`` is the same API with its gapless semantics.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Sequence",
    "delete",
    "get_last_value",
    "get_next_value",
    "get_next_values",
    "preload",
    "sqlite_companion",
    "sync_sequences",
]


def sqlite_companion(database: dict[str, Any], mirror: str = "default") -> dict[str, Any]:
    """A ``DATABASES`` entry for the SQLite file that holds ``database``'s sequences.

    ``mirror`` is the alias of ``database``: under tests the entry mirrors it
    (``TEST["MIRROR"]``), so no test ever reaches the real companion file.
    """
    engine = str(database.get("ENGINE", ""))
    if "sqlite" not in engine:
        raise ValueError(
            f"sqlite_companion() needs a SQLite database, got ENGINE={engine!r}; other "
            "databases keep sys_sequence in the database itself"
        )
    name = str(database.get("NAME") or "")
    if not name or name == ":memory:" or "mode=memory" in name:
        raise ValueError(
            f"NAME={name!r} is in memory: its sequences live in a private in-memory store "
            "and have no file to open"
        )
    options = database.get("OPTIONS") or {}
    # Only what cannot block a reservation: no ATOMIC_REQUESTS, no
    # transaction_mode=IMMEDIATE (a transaction of Django's on this file would
    # hold its write lock, and a reservation in the same request would wait).
    return {
        "ENGINE": engine,
        "NAME": name if name.endswith(".autoseq") else f"{name}.autoseq",
        "OPTIONS": {key: options[key] for key in ("timeout",) if key in options},
        "ATOMIC_REQUESTS": False,
        "TEST": {"MIRROR": mirror},
    }


def preload(using: str | None = None) -> list[str]:
    """Register every field's sequence now (creating missing rows) and read all rows.

    ``using`` is the database rows will be written to (default: each model's
    router choice). Returns the names ready to serve. ``AUTOSEQ["PRELOAD"]``
    calls it on the first request; call it yourself in a worker's start-up.
    """
    from django.db import router

    # Imported on use, like every import of this module: it loads before Django's apps.
    from autoseq_django import registry as sequences
    from autoseq_django.columns import sequence_fields, sequence_models

    names: set[str] = set()
    for model in sequence_models():
        for field in sequence_fields(model):
            if field.sequence_config.gapless:
                continue  # taken in the caller's transaction, never from a block
            alias = using or router.db_for_write(model)
            sequences.lock(field.sequence_config, alias)
            names.update(sequences.registry(sequences.sequence_database(alias)).load())
    return sorted(names)


def sync_sequences(apps: Any, schema_editor: Any) -> None:
    """For ``migrations.RunPython``: move each sequence past ``max()`` of its columns."""
    from autoseq_django.maintenance import sync

    sync(schema_editor.connection.alias, apps=apps)


def __getattr__(name: str) -> Any:
    # django-sequences' calls, imported on use: this package loads before Django's apps.
    if name in ("Sequence", "delete", "get_last_value", "get_next_value", "get_next_values"):
        from autoseq_django import compat

        return getattr(compat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
