"""Small helpers shared by the autoseq_django tests."""

from __future__ import annotations

from autoseq_django import registry as sequences

BACKENDS = ("sqlite", "postgres", "mysql")
#: Django aliases opening the file that holds a backend's sequences.
COMPANIONS = {"sqlite": ("sqlite_seq",)}
#: The alias to put in AUTOSEQ["DATABASE"] so Django and the store see one table.
SEQUENCE_ALIAS = {"sqlite": "sqlite_seq"}


class Reservations:
    """Counts blocks reserved per sequence while connected (blinker ``block_reserved``)."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}

    def __call__(self, sender: object, **kwargs: object) -> None:
        name = str(kwargs["name"])
        self.by_name[name] = self.by_name.get(name, 0) + 1


def stored_current(alias: str, name: str) -> int:
    """``current`` of sequence ``name`` as stored for rows written to ``alias``."""
    row = sequences.store(sequences.sequence_database(alias)).read(name)
    assert row is not None, f"no row {name!r}"
    return row.next_value
