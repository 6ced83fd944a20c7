"""``SysSequence``: the ``sys_sequence`` table as Django sees it (admin, queries).

The schema is the one of ``autoseq.stores.sql.sequence_table`` so a
SQLAlchemy service can share the table. The model is unmanaged: the table
is created by this app's migration only when missing (the SQLAlchemy side
may have made it first) and ``flush`` (``TransactionTestCase``) leaves it
alone, because running processes hold blocks reserved from it.

Names compare byte for byte on every database: on MariaDB/MySQL the store
gives ``name`` the ``utf8mb4_bin`` collation (migration 0004 alters an older
table), so ``orders`` and ``Orders`` are two sequences, as elsewhere.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connections, models

from autoseq.config import NAME_MAX_LENGTH, SequenceConfig
from autoseq_django.sqlite import show_gapless_rows

if TYPE_CHECKING:
    _Manager = models.Manager["SysSequence"]
else:
    _Manager = models.Manager


class SequenceManager(_Manager):
    """``SysSequence.objects``: on SQLite it shows the file's gapless rows too.

    They live in the application's file, beside the companion's rows; see
    `autoseq_django.sqlite.show_gapless_rows`.
    """

    def get_queryset(self) -> models.QuerySet[SysSequence]:
        _show_gapless_rows(self.db)
        return super().get_queryset()

    def using(self, alias: str | None) -> models.QuerySet[SysSequence]:
        _show_gapless_rows(alias or self.db)
        return super().get_queryset().using(alias)


def _show_gapless_rows(alias: str) -> None:
    connection = connections[alias]
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        show_gapless_rows(connection)


class SysSequence(models.Model):
    """One named sequence: ``current`` is the next value nobody has reserved."""

    name: models.CharField[str, str] = models.CharField(
        max_length=NAME_MAX_LENGTH, primary_key=True
    )
    start: models.BigIntegerField[int, int] = models.BigIntegerField()
    end: models.BigIntegerField[int, int] = models.BigIntegerField()
    step: models.BigIntegerField[int, int] = models.BigIntegerField()
    current: models.BigIntegerField[int, int] = models.BigIntegerField(
        help_text="The next value no process has reserved yet."
    )
    batch: models.BooleanField[bool, bool] = models.BooleanField()
    batch_count: models.IntegerField[int, int] = models.IntegerField()
    cycle: models.BooleanField[bool, bool] = models.BooleanField()
    updated_at: models.DateTimeField[datetime | None, datetime | None] = models.DateTimeField(
        null=True, blank=True
    )
    version: models.BigIntegerField[int, int] = models.BigIntegerField(
        default=0, help_text="Bumped by every write; hand-backs compare it."
    )

    objects = SequenceManager()

    class Meta:
        db_table = "sys_sequence"
        managed = False
        ordering = ("name",)
        verbose_name = "sequence"

    def __str__(self) -> str:
        return str(self.name)

    @property
    def last_value(self) -> int:
        """The largest value the sequence can hand out."""
        return self.as_config().last_value

    @property
    def values_left(self) -> int | None:
        """Values not yet reserved before ``end`` (None for a cycling sequence)."""
        if self.cycle:
            return None
        return self.as_config().values_left

    def as_config(self) -> SequenceConfig:
        """The row as an ``autoseq.SequenceConfig`` (``InvalidSequenceConfig`` if impossible)."""
        return SequenceConfig.from_row(self)
