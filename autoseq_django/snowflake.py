"""``SnowflakeField`` and ``SnowflakeAutoField``: snowflake ids for Django models.

The id is taken when the row's INSERT runs, from the generator of the
database running it: ``save(using=...)``, ``.using(...)`` and routers are
respected alike (the key holds a stand-in between ``get_pk_value_on_save``
and the INSERT, other columns fill in ``pre_save``, and raw saves
(``loaddata``) get one when empty). Worker ids are leased from the
``sys_sequence`` database that serves that database, one generator per
layout and store.
Re-exported from `autoseq_django.fields`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models.fields import NOT_PROVIDED
from django.db.models.signals import pre_save

from autoseq.snowflake import SharedSnowflakes, Snowflake
from autoseq_django import registry as sequences

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.forms import Field as FormField

    _BigIntegerField = models.BigIntegerField[int | None, int]
    _BigAutoField = models.BigAutoField[int | None, int]
else:
    _BigIntegerField = models.BigIntegerField
    _BigAutoField = models.BigAutoField

_generators = SharedSnowflakes()


def generator(alias: str, layout: str = "default") -> Snowflake:
    """The generator of ``layout`` for rows written to database ``alias`` (shared, leased once)."""
    return _generators.get(sequences.store(sequences.sequence_database(alias)), layout)


def close_generators() -> None:
    """Close every generator (releasing its worker id); tests and shutdown."""
    _generators.close()


class _Unissued:
    """An id not taken yet: the INSERT that writes ``instance`` takes it, on its own database.

    Django asks a key for its value (``get_pk_value_on_save``) and a column
    for its own (``pre_save``) without saying which database the row goes
    to; the router's guess for an unsaved instance is ``default``, whatever
    ``using=`` says. The compiler's ``get_db_prep_save`` knows the connection.
    """

    __slots__ = ("instance",)

    def __init__(self, instance: models.Model) -> None:
        self.instance = instance

    def __repr__(self) -> str:
        return "<snowflake id taken on insert>"


class _SnowflakeMixin:
    """What both fields share: where ids come from and when they are taken."""

    layout: str
    attname: str
    primary_key: bool
    model: type[models.Model]

    def take(self, using: str) -> int:
        """A new id for a row written to database ``using``, from the layout's generator there."""
        return generator(using, self.layout).next()

    def get_pk_value_on_save(self, instance: models.Model) -> Any:
        return _Unissued(instance)  # not None: Django inserts the row with its key, no RETURNING

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = getattr(model_instance, self.attname)
        if add and (value is None or type(value) is _Unissued):
            return _Unissued(model_instance)
        return value

    def get_db_prep_save(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if type(value) is _Unissued:
            taken = self.take(connection.alias)
            setattr(value.instance, self.attname, taken)
            value = taken
        return super().get_db_prep_save(value, connection)  # type: ignore[misc]


def _fill_raw_saves(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    # loaddata saves raw, so pre_save is never called: fill empty ids here.
    if not kwargs.get("raw"):
        return
    for field in sender._meta.concrete_fields:
        if isinstance(field, _SnowflakeMixin) and getattr(instance, field.attname) is None:
            setattr(instance, field.attname, field.take(kwargs["using"]))


class SnowflakeField(_SnowflakeMixin, _BigIntegerField):
    """A ``BigIntegerField`` (or primary key) holding a snowflake id taken on insert.

    ``layout`` names the snowflake layout whose worker ids are leased (its
    ``name``); a value set by the user is kept.
    """

    description = "Snowflake id (64-bit, time-ordered) taken on insert"

    def __init__(self, *args: Any, layout: str = "default", **kwargs: Any) -> None:
        kwargs.setdefault("blank", True)  # filled on insert, so forms may leave it empty
        self.layout = layout
        super().__init__(*args, **kwargs)

    def has_default(self) -> bool:
        # a key is known before the INSERT: no UPDATE probe first
        return bool(self.primary_key) or super().has_default()

    def get_default(self) -> Any:
        if self.primary_key and self.default is NOT_PROVIDED:
            return None
        return super().get_default()

    def contribute_to_class(
        self, cls: type[models.Model], name: str, private_only: bool = False
    ) -> None:
        super().contribute_to_class(cls, name, private_only=private_only)
        if not cls._meta.abstract:
            pre_save.connect(_fill_raw_saves, sender=cls, dispatch_uid="autoseq-snowflake-raw")

    def formfield(self, **kwargs: Any) -> FormField | None:
        if self.primary_key:
            return None
        return super().formfield(**kwargs)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        if kwargs.get("blank") is True:
            del kwargs["blank"]
        elif not self.blank:
            kwargs["blank"] = False
        if self.layout != "default":
            kwargs["layout"] = self.layout
        # migrations name the public module, so this one may move
        return name, "autoseq_django.fields.SnowflakeField", args, kwargs


class SnowflakeAutoField(_SnowflakeMixin, _BigAutoField):
    """A primary key of snowflake ids, usable as ``DEFAULT_AUTO_FIELD``.

    ``DEFAULT_AUTO_FIELD = "autoseq_django.fields.SnowflakeAutoField"`` gives
    every model without a key of its own snowflake ids (layout ``default``).
    The column is a plain BIGINT: the database never numbers rows itself.
    """

    description = "Snowflake id primary key"
    db_returning = False  # the key is known before the INSERT

    def __init__(self, *args: Any, layout: str = "default", **kwargs: Any) -> None:
        self.layout = layout
        super().__init__(*args, **kwargs)

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        return models.BigIntegerField().db_type(connection)

    def db_type_suffix(self, connection: BaseDatabaseWrapper) -> str | None:
        return None  # no AUTOINCREMENT / AUTO_INCREMENT / IDENTITY

    def has_default(self) -> bool:
        return True  # the key is known before the INSERT: no UPDATE probe first

    def get_default(self) -> Any:
        return None

    def contribute_to_class(
        self, cls: type[models.Model], name: str, private_only: bool = False, **kwargs: Any
    ) -> None:
        super().contribute_to_class(cls, name, private_only=private_only, **kwargs)
        if not cls._meta.abstract:
            pre_save.connect(_fill_raw_saves, sender=cls, dispatch_uid="autoseq-snowflake-raw")

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        if self.layout != "default":
            kwargs["layout"] = self.layout
        return name, "autoseq_django.fields.SnowflakeAutoField", args, kwargs


__all__ = ["SnowflakeAutoField", "SnowflakeField", "close_generators", "generator"]
