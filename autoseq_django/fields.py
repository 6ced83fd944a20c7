"""``SequenceField``: a ``BigIntegerField`` whose value comes from a named sequence.

Values are taken when a row is inserted, never when an instance is built:
the field hands the INSERT compiler a placeholder, and the first one an
INSERT statement meets takes values for all its rows with one ``next_many``,
from the sequence database of the connection running it (``using=`` and
routers are respected). For a primary key, ``bulk_create()`` goes further:
its rows are prepared together, so the whole bulk is served at once (one
reservation, rounded up to whole blocks) and, the keys being known, without
RETURNING. Values a user set are kept; raw saves (``loaddata``) keep theirs
and get one only when empty.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections, models
from django.db.models.fields import NOT_PROVIDED
from django.db.models.signals import pre_save

from autoseq import InvalidSequenceConfig, SequenceConfig
from autoseq.config import MAX_VALUE, SETTING_NAMES, SETTINGS
from autoseq_django import _compat, catchup, conf
from autoseq_django import registry as sequences
from autoseq_django.columns import SequenceColumn
from autoseq_django.columns import sequence_fields as sequence_fields
from autoseq_django.columns import sequence_models as sequence_models

# Every field class's public path: SerialField and the snowflake fields live in
# their own modules, and their deconstruct() names this module, as migrations do.
from autoseq_django.serials import SerialField as SerialField
from autoseq_django.serials import gapless_problems, given_back, note_taken, take_gapless_values
from autoseq_django.snowflake import SnowflakeAutoField as SnowflakeAutoField
from autoseq_django.snowflake import SnowflakeField as SnowflakeField

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.forms import Field as FormField

    _BigIntegerField = models.BigIntegerField[int | None, int]
    _BigAutoField = models.BigAutoField[int | None, int]
else:
    _BigIntegerField = models.BigIntegerField
    _BigAutoField = models.BigAutoField

#: The sequence settings a field accepts, besides the sequence name.
SEQUENCE_OPTIONS = SETTING_NAMES
_UNKNOWN = -(2**64)  # below every value: nothing known yet
_DEFAULTS = {setting.name: setting.default for setting in SETTINGS}


class _Unfilled:
    """What an unsaved key holds between ``bulk_create()``'s preparation and its INSERT.

    ``get_pk_value_on_save`` puts one of these (shared by every instance a
    thread prepares until the first INSERT) in the key, so Django treats the
    rows as keyed and needs no RETURNING; the first INSERT statement then
    takes values for all of them at once (one ``next_many`` for the whole
    bulk, however Django splits it into statements).
    """

    __slots__ = ("field", "filled", "instances")
    contains_column_references = False
    contains_aggregate = False
    contains_over_clause = False

    def __init__(self, field: SequenceField) -> None:
        self.field = field
        self.filled = False
        self.instances: list[models.Model] = []

    def __repr__(self) -> str:
        return f"<{self.field.sequence_name} value taken on insert>"

    def resolve_expression(self, *args: Any, **kwargs: Any) -> _Unfilled:
        return self

    def as_sql(self, *args: Any, **kwargs: Any) -> Any:
        # Only an INSERT takes values (see SequenceField.pre_save); anything
        # else, say save(update_fields=...) on an unsaved instance, has no key.
        raise ValueError(
            f"{self.field.model._meta.label}.{self.field.name} has no value yet: a sequence "
            "value is taken when the row is inserted; save() it without update_fields first"
        )


class _Pending:
    """The INSERT compiler's view of one missing value; resolved per statement."""

    __slots__ = ("field", "ignore", "instance", "objs", "unfilled", "upsert")
    contains_column_references = False
    contains_aggregate = False
    contains_over_clause = False

    def __init__(
        self,
        field: SequenceField,
        instance: models.Model,
        unfilled: _Unfilled | None,
        objs: Sequence[Any] = (),
        ignore: bool = False,
        upsert: bool = False,
    ) -> None:
        self.field = field
        self.instance = instance
        self.unfilled = unfilled
        self.objs = objs
        #: bulk_create(ignore_conflicts=True): the keys go again after the INSERT
        self.ignore = ignore
        #: bulk_create(update_conflicts=True): the keys come back from the rows
        self.upsert = upsert

    def resolve_expression(self, query: Any = None, *args: Any, **kwargs: Any) -> _Pending:
        # The compiler passes its InsertQuery: its objs are every row of the
        # statement, so the whole statement is served by one next_many().
        objs = _compat.insert_rows(query) or (self.instance,)
        return _Pending(
            self.field,
            self.instance,
            self.unfilled,
            objs,
            _compat.ignores(query),
            _compat.upserts(query),
        )


class _Preparing(threading.local):
    #: By id(field): the stand-in instances prepared now share (see _Unfilled).
    unfilled: dict[int, _Unfilled] | None = None
    #: The stand-in get_pk_value_on_save just gave a key Django found empty.
    asked: _Unfilled | None = None


_preparing = _Preparing()


class SequenceField(SequenceColumn, _BigIntegerField):
    """An integer column (or primary key) filled from sequence ``sequence`` on insert.

    ``sequence`` defaults to the model's ``db_table``. ``start``, ``end``,
    ``step``, ``batch``, ``batch_count`` and ``cycle`` are the settings of a
    row created on first use; unset ones come from ``AUTOSEQ["DEFAULTS"]``,
    then from [`autoseq.SequenceConfig`][autoseq.config.SequenceConfig]. A stored row wins over
    them.
    """

    description = "Integer taken from a named sequence in sys_sequence"
    #: An AutoField subclass is editable like AutoField: Django knows it is the key.
    _key_editable = False

    def __init__(
        self,
        *args: Any,
        sequence: str | None = None,
        start: int | None = None,
        end: int | None = None,
        step: int | None = None,
        batch: bool | None = None,
        batch_count: int | None = None,
        cycle: bool | None = None,
        gapless: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("blank", True)  # filled on insert, so forms may leave it empty
        if not self._key_editable:
            # Not editable, as AutoField is in effect: forms and the admin leave
            # the column out (inline formsets carry a key hidden), and Django
            # REST framework maps it read-only, so no client chooses its own
            # number. ``editable=True`` on the field gives the input back.
            kwargs.setdefault("editable", False)
        if not isinstance(gapless, bool):
            raise InvalidSequenceConfig(f"gapless must be True or False, got {gapless!r}")
        self.gapless = gapless  # declared on the field's SequenceConfig (see sequence_config)
        self.sequence = sequence
        self.sequence_options: dict[str, Any] = {
            key: value
            for key, value in zip(
                SEQUENCE_OPTIONS, (start, end, step, batch, batch_count, cycle), strict=True
            )
            if value is not None
        }
        self._config: tuple[conf.AutoseqSettings, SequenceConfig] | None = None
        #: By write alias, the largest value known not to be ahead of the sequence
        #: (see autoseq_django.catchup): values above it are noted when written.
        self._known: dict[str, int] = {}
        super().__init__(*args, **kwargs)

    # what the sequence is -----------------------------------------------------

    @property
    def sequence_name(self) -> str:
        """The sequence's name: ``sequence`` or the model's ``db_table``."""
        return self.sequence or self.model._meta.db_table

    @property
    def sequence_config(self) -> SequenceConfig:
        """The config a missing row is created from (field arguments over defaults)."""
        settings = conf.get()
        cached = self._config
        if cached is None or cached[0] is not settings:
            cached = (
                settings,
                settings.sequence_config(
                    self.sequence_name, **self.sequence_options, gapless=self.gapless
                ),
            )
            self._config = cached
        return cached[1]

    def take(self, using: str, count: int = 1) -> list[int]:
        """``count`` values for rows written to database ``using``."""
        config = self.sequence_config
        if config.gapless:
            values = take_gapless_values(config, connections[using], count, integer_key=True)
        else:
            if catchup.pending():
                catchup.flush(self.sequence_name)  # keys loaded meanwhile: move past them first
            lock = sequences.lock(config, using, self)
            values = [lock.next()] if count == 1 else lock.next_many(count)
        top = values[-1] if count == 1 else max(values)
        if top > self._known.get(using, _UNKNOWN):
            self._known[using] = top
        return values

    # Django hooks ---------------------------------------------------------------

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        if self.primary_key and connection.vendor == "sqlite":
            # "integer primary key" makes the key SQLite's rowid (64-bit):
            # one B-tree per row instead of a table plus a unique index.
            return "integer"
        return super().db_type(connection)

    def has_default(self) -> bool:
        # Django asks this right after get_pk_value_on_save() for a new
        # instance: a key it found empty is taken on insert, so the row is
        # inserted straight away (no UPDATE probe), as for keys with defaults.
        # A new instance that already holds a key (a multi-table child
        # saved for an existing parent, Model(id=5).save()) is probed with an
        # UPDATE first, as BigAutoField's is.
        if self.primary_key:
            asked = _preparing.asked
            _preparing.asked = None
            return asked is not None and asked.field is self and not asked.filled
        return super().has_default()

    def get_default(self) -> Any:
        if self.primary_key and self.default is NOT_PROVIDED:
            return None
        return super().get_default()

    def get_pk_value_on_save(self, instance: models.Model) -> Any:
        # A stand-in shared by the instances prepared together (bulk_create
        # calls this for each one before any INSERT); see _Unfilled.
        open_ = _preparing.unfilled
        if open_ is None:
            open_ = _preparing.unfilled = {}
        unfilled = open_.get(id(self))  # by id: Field.__hash__ is slow, this runs per row
        if unfilled is None or unfilled.filled:
            unfilled = open_[id(self)] = _Unfilled(self)
        unfilled.instances.append(instance)
        _preparing.asked = unfilled
        return unfilled

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = getattr(model_instance, self.attname)
        if add and (value is None or type(value) is _Unfilled):
            return _Pending(self, model_instance, value)
        if add and self.gapless and given_back(model_instance, self.attname):
            setattr(model_instance, self.attname, None)
            return _Pending(self, model_instance, None)
        return value

    def get_db_prep_save(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if type(value) is int:  # the common case in a bulk: skip the generic chain
            if value > self._known.get(connection.alias, _UNKNOWN) and self.unique:
                # A key the sequence did not give, noted when its statement
                # runs: a bulk filled by this statement takes its values first.
                catchup.note_written(self, connection.alias, value)
            if self.primary_key:
                # Bound as the plain int, as BigAutoField binds its keys; any
                # other column as BigIntegerField (on psycopg 3 an Int8
                # wrapper: one more object per row, a slower array dump).
                return value
            return connection.ops.adapt_integerfield_value(value, "BigIntegerField")
        if isinstance(value, _Pending):
            self._fill(value, connection.alias)
            value = getattr(value.instance, self.attname)
            if type(value) is int:  # as above, so a bulk's values all have one type
                return self.get_db_prep_save(value, connection)
        return super().get_db_prep_save(value, connection)

    def _fill(self, pending: _Pending, using: str) -> None:
        """Values for every row prepared with ``pending`` and every empty row of its statement."""
        value_of = attrgetter(self.attname)
        unfilled = pending.unfilled
        objs = pending.objs or (pending.instance,)
        fresh = None  # the stand-in filled now; one a failed fill left behind is empty
        missing: list[models.Model] = []
        if unfilled is not None and not unfilled.filled:
            fresh, instances = unfilled, unfilled.instances
            unfilled.filled = True
            unfilled.instances = []
            if pending.ignore or pending.upsert:
                # Rows a conflict skips or updates get no key of ours: take
                # values for this statement's rows only, and clear them (or
                # set the stored ones) after it (_take_for).
                statement = set(map(id, objs))
                instances = [obj for obj in instances if id(obj) in statement]
            held = list(map(value_of, instances))  # one C loop, no call per row
            if held.count(fresh) == len(held):
                missing = instances
            else:  # some were given a key or another stand-in since
                pairs = zip(instances, held, strict=True)
                missing = [obj for obj, value in pairs if value is fresh]
        values = list(map(value_of, objs))
        given: list[int] = []
        if fresh is None or values.count(fresh) != len(values):
            known = self._known.get(using, _UNKNOWN)
            for obj, value in zip(objs, values, strict=True):
                if value is None or (type(value) is _Unfilled and value is not fresh):
                    missing.append(obj)
                elif type(value) is int and value > known and self.unique:
                    given.append(value)
        if missing:
            self._take_for(missing, given, using, pending.ignore)
            if pending.upsert:
                _after_upsert(self, objs, missing, using)

    def _take_for(
        self, missing: list[models.Model], given: list[int], using: str, ignore: bool
    ) -> None:
        """Values for ``missing``, none of them a key ``given`` in the same statement."""
        values = self.take(using, len(missing))
        if given and not set(given).isdisjoint(values):
            # Keys given here lie ahead of the sequence: move past them first.
            # Not by default: a bulk's later statements may give keys past
            # these too, and values taken past this statement's would meet them.
            for value in given:
                catchup.note(self, using, value)
            values = self.take(using, len(missing))
        attname = self.attname
        for obj, value in zip(missing, values, strict=True):
            setattr(obj, attname, value)
        if self.gapless:
            note_taken(missing, attname, connections[using])
        elif self.unique:
            catchup.filled(self, missing, values)
        if ignore:
            catchup.clear_after_insert(attname, missing)

    def contribute_to_class(
        self, cls: type[models.Model], name: str, private_only: bool = False
    ) -> None:
        super().contribute_to_class(cls, name, private_only=private_only)
        if not cls._meta.abstract:
            pre_save.connect(_fill_raw_saves, sender=cls, dispatch_uid="autoseq-raw-saves")
            if self.primary_key and self.gapless:
                pre_save.connect(_renew_given_back_key, sender=cls, dispatch_uid="autoseq-renew")

    def formfield(self, **kwargs: Any) -> FormField | None:
        if self.primary_key:
            return None  # like AutoField: filled on insert, never typed in
        return super().formfield(**kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("blank") is True:
            del kwargs["blank"]
        elif not self.blank:
            kwargs["blank"] = False
        if not self._key_editable:
            if self.editable:
                kwargs["editable"] = True
            else:
                kwargs.pop("editable", None)
        if self.sequence is not None:
            kwargs["sequence"] = self.sequence
        kwargs.update(self.sequence_options)
        if self.gapless:
            kwargs["gapless"] = True
        return name, path, args, kwargs

    # system checks --------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return [*super().check(**kwargs), *self._check_sequence()]

    def _check_sequence(self) -> list[checks.CheckMessage]:
        try:
            defaults = conf.get().defaults
        except Exception:  # noqa: BLE001 - the settings check reports it
            defaults = {}
        merged = {**defaults, **self.sequence_options}
        errors: list[checks.CheckMessage] = []

        def error(code: str, message: str, hint: str) -> None:
            errors.append(checks.Error(message, hint=hint, obj=self, id=f"autoseq.{code}"))

        try:
            SequenceConfig(self.sequence_name, **{k: merged[k] for k in merged if k in _DEFAULTS})
        except InvalidSequenceConfig as exc:
            code, hint = _check_code(exc)
            error(code, f"SequenceField cannot make a sequence: {exc}.", hint)
        if merged.get("cycle", _DEFAULTS["cycle"]) and (self.primary_key or self.unique):
            error(
                "E004",
                "SequenceField with cycle=True on a primary key or unique column: "
                "values repeat after end, so inserts will collide.",
                "Drop cycle=True, or use the field on a column that is not unique.",
            )
        if self.default is not NOT_PROVIDED or self.has_db_default():
            error(
                "E006",
                "SequenceField takes its value from the sequence; default/db_default "
                "would hide it.",
                "Remove default= and db_default= from the field.",
            )
        errors.extend(gapless_problems(self, self.gapless, "SequenceField"))
        return errors


def _check_code(exc: InvalidSequenceConfig) -> tuple[str, str]:
    """The check id and hint of what ``SequenceConfig`` refused (E005: anything else)."""
    if exc.setting == "step":
        return "E001", "Use step=1 or more."
    if exc.rule == "order":
        return "E002", "Lower start or raise end."
    if exc.setting == "batch_count":
        return "E003", "Use batch_count=1 or more (batch=False reserves one value per round trip)."
    if exc.setting == "end" and exc.rule == "size":
        return "E007", f"Use end <= {MAX_VALUE}."
    return "E005", "Fix the arguments."


def _after_upsert(
    field: SequenceField, objs: Sequence[Any], filled: list[models.Model], using: str
) -> None:
    """After an ``update_conflicts`` INSERT, ``filled`` hold their rows' keys, as BigAutoField's.

    Django sets keys from ``RETURNING`` only for objects it saw without
    one; ours were filled before. Where the database returns rows from a
    bulk INSERT, the statement returns the keys and each object takes its
    row's (the old key of a row a conflict updated); elsewhere none keeps
    one, as with ``BigAutoField`` there. Not yet for a model whose INSERT
    returns columns of its own (``db_default``): its key stays as filled.
    """
    if not field.primary_key or field.model._meta.db_returning_fields:
        return
    if connections[using].features.can_return_rows_from_bulk_insert:
        catchup.return_keys_of_insert(field, objs, filled)
    else:
        catchup.clear_after_insert(field.attname, filled)


def _fill_raw_saves(sender: type[models.Model], instance: models.Model, **kwargs: Any) -> None:
    # loaddata saves raw: the compiler never calls pre_save, so an empty
    # sequence column is filled here, from the database being written to.
    if not kwargs.get("raw"):
        if kwargs.get("update_fields") is not None:
            _refuse_update_without_key(sender, instance)
        return
    using = kwargs["using"]
    for field in sender._meta.concrete_fields:
        if isinstance(field, SequenceField) and getattr(instance, field.attname) is None:
            setattr(instance, field.attname, field.take(using)[0])


def _renew_given_back_key(
    sender: type[models.Model], instance: models.Model, **kwargs: Any
) -> None:
    # Django chooses between UPDATE and INSERT by the key, before any
    # field's pre_save: a gapless key whose transaction rolled back may be
    # another writer's row by now, so the instance is a new one again.
    if not kwargs.get("raw") and given_back(instance, sender._meta.pk.attname):
        setattr(instance, sender._meta.pk.attname, None)
        instance._state.adding = True


def _refuse_update_without_key(sender: type[models.Model], instance: models.Model) -> None:
    # A key taken on insert counts as a default, which makes Django insert
    # a new instance straight away, update_fields or not; AutoField refuses.
    pk = sender._meta.pk
    if isinstance(pk, SequenceField):
        value = getattr(instance, pk.attname)
        if value is None or type(value) is _Unfilled:
            raise ValueError("Cannot force an update in save() with no primary key.")


# django-stubs types AutoFieldMixin.formfield as returning None and its
# contribute_to_class without private_only; SequenceField's are Field's own.
class SequenceAutoField(SequenceField, _BigAutoField):  # type: ignore[misc]
    """A ``BigAutoField`` whose values come from a sequence (by default named after the table).

    For ``DEFAULT_AUTO_FIELD`` and ``AppConfig.default_auto_field``: every
    model without an explicit key gets one. The column is ``BigAutoField``'s
    (the database's own counter stays as a fallback for raw SQL), so moving
    a project from ``BigAutoField`` is an ``AlterField`` that changes no
    column type; the sequence row is created past ``max()`` of the keys
    already there. Takes the same sequence arguments as ``SequenceField``.
    """

    description = "Big integer key taken from a named sequence in sys_sequence"
    _key_editable = True
    # The key is known before the INSERT: no RETURNING needed.
    db_returning = False
