"""django-sequences' API with its semantics: gapless, in the caller's transaction.

``from autoseq_django.django_sequences import get_next_value`` (or
``Sequence``, ``get_next_values``, ``get_last_value``, ``delete``) in place
of ``from sequences import ...``, and code written for django-sequences
runs unchanged: each value is taken in the caller's transaction (or one of
its own in autocommit) under the row's lock, a rollback gives it back,
``nowait=True`` raises ``DatabaseError`` when another transaction holds the
row, and ``get_last_value`` reads what the transaction sees. The rows live
in ``sys_sequence`` beside autoseq's other sequences. For values from
blocks (no gaps promised, no lock held), use ``autoseq_django.get_next_value``.
"""

from __future__ import annotations

from collections.abc import Iterator

from autoseq_django import compat

__all__ = ["Sequence", "delete", "get_last_value", "get_next_value", "get_next_values"]


def get_next_value(
    sequence_name: str = "default",
    initial_value: int = 1,
    reset_value: int | None = None,
    *,
    nowait: bool = False,
    using: str | None = None,
) -> int:
    """The next value of ``sequence_name``, taken in the caller's transaction."""
    return compat.get_next_value(
        sequence_name, initial_value, reset_value, nowait=nowait, using=using, gapless=True
    )


def get_next_values(
    batch_size: int,
    sequence_name: str = "default",
    initial_value: int = 1,
    *,
    nowait: bool = False,
    using: str | None = None,
) -> range:
    """``batch_size`` consecutive values, as a ``range`` (django-sequences' type)."""
    values = compat.get_next_values(
        batch_size, sequence_name, initial_value, nowait=nowait, using=using, gapless=True
    )
    return range(values[0], values[-1] + 1) if values else range(0)


def get_last_value(sequence_name: str = "default", *, using: str | None = None) -> int | None:
    """The last value taken, as the caller's transaction sees it; None when none."""
    return compat.get_last_value(sequence_name, using=using, gapless=True)


def delete(sequence_name: str = "default", *, using: str | None = None) -> bool:
    """Delete the sequence (in the caller's transaction); True if it existed."""
    return compat.delete(sequence_name, using=using, gapless=True)


class Sequence(compat.Sequence):
    """django-sequences' ``Sequence``: gapless, in the caller's transaction."""

    def __init__(
        self,
        sequence_name: str = "default",
        initial_value: int = 1,
        reset_value: int | None = None,
        *,
        using: str | None = None,
    ) -> None:
        super().__init__(sequence_name, initial_value, reset_value, using=using, gapless=True)

    def get_next_values(self, batch_size: int, *, nowait: bool = False) -> range:  # type: ignore[override]
        """``batch_size`` consecutive values, as a ``range``."""
        values = super().get_next_values(batch_size, nowait=nowait)
        return range(values[0], values[-1] + 1) if values else range(0)

    def __iter__(self) -> Iterator[int]:
        return self
