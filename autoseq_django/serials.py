"""``SerialField``: a ``CharField`` filled with an `autoseq.Serial` value on insert.

The value is taken when the INSERT is compiled (``save()``, ``create()``,
``bulk_create()``), never when an instance is built, from the sequence
database of the connection running it. A value the user set is kept. With
``gapless=True`` the number is taken on Django's own connection, inside the
caller's ``atomic()`` block, with the statements of
[`autoseq.stores.sql.gapless`][autoseq.stores.sql.gapless]:
the row stays locked until that block's transaction ends, a rollback gives
the number back, and autocommit outside ``atomic()`` is refused.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, models
from django.db.models.fields import NOT_PROVIDED

from autoseq import (
    GaplessUnavailable,
    InvalidSequenceConfig,
    SequenceConfig,
    Serial,
)
from autoseq.serial import SerialOptions, template_length
from autoseq_django import _compat, columns, conf
from autoseq_django import registry as sequences
from autoseq_django.catchup import guard_inserts
from autoseq_django.sqlite import companion_path

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    _CharField = models.CharField[str | None, str]
else:
    _CharField = models.CharField


class _Pending:
    """What ``pre_save`` hands the INSERT compiler for a row without a serial."""

    __slots__ = ("instance",)

    def __init__(self, instance: models.Model) -> None:
        self.instance = instance


class SerialField(_CharField):
    """A string column filled on insert from a serial: ``SerialField("INV-{date:%Y}-{n:05d}")``.

    ``max_length`` defaults to the longest serial the template makes. The
    serial is named ``sequence``, else ``<db_table>.<field name>``; the
    other arguments are [`autoseq.Serial`][autoseq.serial.Serial]'s.
    """

    description = "Serial number taken from a named sequence in sys_sequence"

    def __init__(
        self,
        template: str,
        *args: Any,
        sequence: str | None = None,
        period: str | None = None,
        tz: str | tzinfo = "UTC",
        start: int = 1,
        step: int = 1,
        batch_count: int = 100,
        gapless: bool = False,
        cycle: bool = False,
        clock: Callable[[], datetime] | None = None,
        **kwargs: Any,
    ) -> None:
        # gapless stays the field's own: its values are taken on Django's
        # connection (take_gapless), so the Serial it builds is never gapless.
        self.serial_options = SerialOptions(
            template,
            period=period,
            tz=tz,
            start=start,
            step=step,
            batch_count=batch_count,
            cycle=cycle,
            clock=clock,
        )
        # A template or setting Serial refuses is reported by the system checks
        # (autoseq.E016) and raised at the first save, not here: a migration
        # written before a rule tightened must still load, to be followed by one
        # that fixes the field.
        self.refusal: str | None = None
        try:
            probe = self.serial_options.check(sequence or "x")
        except InvalidSequenceConfig as exc:
            self.refusal = str(exc)
        else:
            kwargs.setdefault("max_length", probe.max_length)
        self.template = template
        self.sequence = sequence
        self.gapless = gapless
        kwargs.setdefault("blank", True)  # filled on insert, so forms may leave it empty
        # Taken on insert: forms, the admin and DRF leave it out (read-only),
        # so no client chooses its own number; ``editable=True`` gives it back.
        kwargs.setdefault("editable", False)
        self._serials: dict[int, Serial] = {}
        self._guard = threading.Lock()
        super().__init__(*args, **kwargs)

    @property
    def serial_name(self) -> str:
        """The serial's name: ``sequence`` or ``<db_table>.<field name>``."""
        return self.sequence or f"{self.model._meta.db_table}.{self.name}"

    def serial(self, alias: str) -> Serial:
        """The [`Serial`][autoseq.serial.Serial] serving rows written to database ``alias``."""
        registry = sequences.registry(sequences.sequence_database(alias))
        found = self._serials.get(id(registry))
        if found is None or found.registry is not registry:
            with self._guard:
                found = self.serial_options.build(registry, self.serial_name)
                self._serials[id(registry)] = found
        return found

    def take(self, connection: BaseDatabaseWrapper) -> str:
        """The next serial for a row written through ``connection``."""
        serial = self.serial(connection.alias)
        if not self.gapless:
            return serial.next()
        return take_gapless(serial, connection)

    # Django hooks ---------------------------------------------------------------

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = getattr(model_instance, self.attname)
        if add and (
            value in (None, "") or (self.gapless and given_back(model_instance, self.attname))
        ):
            return _Pending(model_instance)
        return value

    def get_db_prep_save(self, value: Any, connection: BaseDatabaseWrapper) -> Any:
        if isinstance(value, _Pending):
            taken = self.take(connection)
            setattr(value.instance, self.attname, taken)
            if self.gapless:
                note_taken((value.instance,), self.attname, connection)
            value = taken
        return super().get_db_prep_save(value, connection)

    # system checks --------------------------------------------------------------
    # A bad template, period, tz, start, step or batch_count is E016; the
    # others need the model.

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        inherited = super().check(**kwargs)
        if self.refusal is not None:  # no max_length without a template: E016 says why
            inherited = [message for message in inherited if message.id != "fields.E120"]
        return [*inherited, *self._check_serial()]

    def _check_serial(self) -> list[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []

        def error(code: str, message: str, hint: str) -> None:
            errors.append(checks.Error(message, hint=hint, obj=self, id=f"autoseq.{code}"))

        if self.refusal is not None:
            error(
                "E016",
                f"SerialField cannot make serials: {self.refusal}.",
                "Change the template or setting as the message says; saves raise "
                "InvalidSequenceConfig until then.",
            )
            return errors
        longest = template_length(self.template, self.serial_options.period)
        if isinstance(self.max_length, int) and self.max_length < longest:
            error(
                "E012",
                f"SerialField max_length={self.max_length} is shorter than the longest serial "
                f"of {self.template!r} ({longest} characters).",
                f"Drop max_length (it defaults to {longest}) or raise it to {longest} or more.",
            )
        if self.default is not NOT_PROVIDED or self.has_db_default():
            error(
                "E013",
                "SerialField takes its value from the serial; default/db_default would hide it.",
                "Remove default= and db_default= from the field.",
            )
        if self.serial_options.cycle and (self.primary_key or self.unique):
            error(
                "E015",
                "SerialField with cycle=True on a primary key or unique column: the counter "
                "wraps back to start, so serials repeat and inserts will collide.",
                "Drop cycle=True, or widen {n} and drop unique.",
            )
        errors.extend(gapless_problems(self, self.gapless, "SerialField"))
        return errors

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        kwargs.pop("blank", None)
        if self.editable:
            kwargs["editable"] = True
        else:
            kwargs.pop("editable", None)
        kwargs["template"] = self.template
        if self.sequence is not None:
            kwargs["sequence"] = self.sequence
        if self.gapless:
            kwargs["gapless"] = True
        for option in dataclasses.fields(SerialOptions):
            value = getattr(self.serial_options, option.name)
            if option.name not in ("template", "gapless") and option.default != value:
                kwargs[option.name] = value
        return name, "autoseq_django.fields.SerialField", args, kwargs


# gapless on Django's connection ----------------------------------------------------


#: The vendors whose connections run gapless takes: the SQL store's ``GAPLESS_DIALECTS``
#: (`autoseq.stores.sql.gapless`), written here as Django's checks run before
#: anything imports SQLAlchemy; a test holds them equal.
GAPLESS_VENDORS = ("postgresql", "mysql", "sqlite")


def gapless_problems(field: models.Field[Any, Any], gapless: bool, kind: str) -> list[Any]:
    """``autoseq.E014``: a gapless field whose numbers could not share the row's transaction.

    Run by the system checks of ``SerialField`` and ``SequenceField``: the
    databases the model is written to must hold their own sequences (no
    ``AUTOSEQ["DATABASE"]`` or router sending ``SysSequence`` elsewhere) and be
    PostgreSQL, MariaDB/MySQL or SQLite; the save would raise
    ``GaplessUnavailable`` otherwise. No database is touched.
    """
    if not gapless:
        return []
    from django.conf import settings
    from django.db import connections, router

    model = field.model
    problems = []
    for alias in sorted(settings.DATABASES):
        try:
            if not router.allow_migrate_model(alias, model):
                continue
            holder = sequences.sequence_database(alias)
            shared = shares_transaction(connections[alias])
        except ImproperlyConfigured:
            return []  # the AUTOSEQ settings are wrong: autoseq.E008 says how
        vendor = connections[alias].vendor
        if not shared:
            why = f"its sequences live in database {holder!r}, not {alias!r} where rows are written"
        elif vendor not in GAPLESS_VENDORS:
            why = f"database {alias!r} is {vendor}, which gapless numbering does not support"
        else:
            continue
        problems.append(
            checks.Error(
                f"{kind}(gapless=True) on {model._meta.label}.{field.name}: {why}, so a number "
                "cannot be taken in the same transaction as the row (saves would raise "
                "GaplessUnavailable).",
                hint="Keep sys_sequence in the database the model is written to "
                "(PostgreSQL, MariaDB/MySQL or SQLite), or drop gapless=True.",
                obj=field,
                id="autoseq.E014",
            )
        )
    return problems


class _Taken:
    """The gapless values one INSERT took on database ``alias``, until its transaction ends.

    Registered with ``on_commit``: Django runs it when the transaction
    commits, and drops it when the transaction, or a savepoint it was
    registered in, rolls back. A token that has neither run nor is still
    waiting was dropped: its values were given back to the sequence, and
    the next writer may hold them now.
    """

    __slots__ = ("alias", "committed")

    def __init__(self, alias: str, committed: bool = False) -> None:
        self.alias = alias
        self.committed = committed

    def __call__(self) -> None:
        self.committed = True

    def given_back(self) -> bool:
        """Whether the transaction these values were taken in rolled them back."""
        if self.committed:
            return False
        return not _compat.on_commit_pending(connections[self.alias], self)

    # A copy shares the one transaction's fate; a pickle, read in another
    # process, keeps what is known now.
    def __copy__(self) -> _Taken:
        return self

    def __deepcopy__(self, memo: Any) -> _Taken:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, bool]]:
        return _Taken, (self.alias, not self.given_back())


def note_taken(
    instances: Iterable[models.Model], attname: str, connection: BaseDatabaseWrapper
) -> None:
    """Remember that ``instances`` got ``attname`` from a gapless take in ``connection``'s
    current transaction (one ``on_commit`` for them all)."""
    token = _Taken(connection.alias)
    connection.on_commit(token)
    for instance in instances:
        state: Any = instance._state
        taken = state.__dict__.get("autoseq_taken")
        # A new dict, never one changed in place: copy.copy() of an instance
        # shares its state's dict with the original.
        state.autoseq_taken = {attname: token} if taken is None else {**taken, attname: token}


def given_back(instance: models.Model, attname: str) -> bool:
    """Whether ``instance``'s ``attname`` is a gapless value whose transaction rolled back.

    DESIGN rule 7: the value's old holder must not reuse it. Asked when
    the instance is saved again (Django has no rollback signal); the caller
    then takes a fresh value, whose note replaces this one.
    """
    taken: dict[str, _Taken] | None = instance._state.__dict__.get("autoseq_taken")
    token = taken.get(attname) if taken else None
    return token is not None and token.given_back()


def take_gapless(serial: Serial, connection: BaseDatabaseWrapper) -> str:
    """The next gapless serial, in ``connection``'s current ``atomic()`` transaction."""
    day = serial._now()
    (value,) = take_gapless_values(serial.row_config(day), connection, 1)
    return serial.format(value, day)


def shares_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether a gapless number can be taken in ``connection``'s own transaction.

    Yes when the alias holds its own sequences, and on SQLite when they live
    in the file's companion (``AUTOSEQ["DATABASE"]`` naming its
    ``sqlite_companion`` alias): gapless rows are then kept in the
    application's file itself (``autoseq.stores.sql.gapless.sqlite_table``), never in
    the companion, so one commit covers the number and the row.
    """
    if sequences.sequence_database(connection.alias) == connection.alias:
        return True
    if connection.vendor != "sqlite":
        return False
    return companion_path(connection) is not None


class _Plan:
    """What a gapless take on one Django connection needs that only settings can change.

    Checked against ``conf.get()`` and ``sequences.generation()``, both renewed
    by any change to AUTOSEQ, DATABASES or DATABASE_ROUTERS. ``single`` is the
    SQL of [`single_statement`][autoseq.stores.sql.gapless.single_statement] for
    this connection's cursor (None on SQLite, whose rows are made in the caller's
    transaction).
    """

    __slots__ = (
        "dialect",
        "generation",
        "idle",
        "joined",
        "joins_begin",
        "returning",
        "settings",
        "single",
        "store",
        "table",
        "tuples_ok",
    )

    def __init__(self, settings: Any, generation: int, store: Any, dialect: str) -> None:
        self.settings = settings
        self.generation = generation
        self.store = store
        self.dialect = dialect
        gapless = _gapless()
        self.table = gapless.gapless_table(store, dialect)
        self.single: str | None = None
        self.returning = False
        if dialect != "sqlite":
            statement, self.returning = gapless.single_statement(self.table, dialect)
            self.single = gapless.cursor_statement(statement, dialect).sql
        #: psycopg 3: "BEGIN; <single>" with the name written in, per name (see _begin_and_take).
        self.joins_begin = dialect == "postgresql" and _psycopg3()
        self.joined: dict[str, bytes] = {}
        self.idle: Any = None
        self.tuples_ok: Any = None
        if self.joins_begin:
            from psycopg import pq

            self.idle, self.tuples_ok = pq.TransactionStatus.IDLE, pq.ExecStatus.TUPLES_OK


#: Per Django connection. A gapless value is a statement inside someone's
#: transaction, holding a row lock: the Python around it is kept as short as
#: the statement.
_plans: weakref.WeakKeyDictionary[Any, _Plan] = weakref.WeakKeyDictionary()


def take_gapless_values(
    config: SequenceConfig,
    connection: BaseDatabaseWrapper,
    count: int = 1,
    *,
    integer_key: bool = False,
) -> list[int]:
    """``count`` values of row ``config``, in ``connection``'s current ``atomic()`` transaction.

    What a gapless ``SerialField`` or ``SequenceField`` takes at insert. For
    an integer key (``integer_key``) a row created here starts past the
    largest value already stored in the columns using the sequence.
    """
    if not connection.in_atomic_block:
        raise GaplessUnavailable(
            f"sequence {config.name!r} is gapless but the save runs in autocommit: wrap it "
            "in transaction.atomic() so the number is given back if the transaction fails"
        )
    plan = _plans.get(connection)
    if plan is None or plan.settings is not conf.get() or plan.generation != sequences.generation():
        plan = _plan(config, connection)
    if (
        plan.single is not None
        and count == 1
        and config.step == 1
        and _gapless().row_known(plan.store, config.name)
    ):
        # One value of a row in ordinary shape: the one statement, read straight
        # off the cursor. No row matched (exhausted, hand-edited, deleted): the
        # full path, which knows what to do.
        taken = _begin_and_take(connection, plan, config.name) if plan.joins_begin else None
        if taken is None:
            taken = _take_single(connection, plan, config.name)
        if taken is not None:
            return [taken]
    floor = None
    if integer_key:
        alias = connection.alias

        def floor() -> int | None:
            return columns.columns_floor(config.name, alias)

    run = _gapless().cursor_run(connection.cursor, plan.dialect)
    values: list[int] = _gapless().take_with(
        run, plan.dialect, plan.store, plan.table, config, count, floor
    )
    return values


def _take_single(connection: BaseDatabaseWrapper, plan: _Plan, name: str) -> int | None:
    """One value of row ``name`` by ``plan.single`` on Django's cursor; None if no row matched."""
    assert plan.single is not None
    with connection.cursor() as cursor:
        cursor.execute(plan.single, (name,))
        if plan.returning:
            row = cursor.fetchone()
            returned = None if row is None else row[0]
            taken: int | None = _gapless().single_value(True, returned, 1, None)
        else:
            taken = _gapless().single_value(False, None, cursor.rowcount, cursor.lastrowid)
        return taken


def _psycopg3() -> bool:
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def _begin_and_take(connection: BaseDatabaseWrapper, plan: _Plan, name: str) -> int | None:
    """PostgreSQL on psycopg 3: open the transaction and take the value in one round trip.

    A gapless take is often the first statement of its transaction: a
    ``SerialField`` is filled as the row's ``INSERT`` is compiled, inside
    ``atomic()``. psycopg sends ``BEGIN`` on its own before a transaction's
    first statement and waits for the reply; this sends ``BEGIN`` and the
    update as one query instead (libpq's simple query, through psycopg's
    ``pgconn``), opening the very transaction psycopg would have opened:
    psycopg reads the transaction's state from libpq, so ``atomic()``'s
    commit or rollback ends it as usual. One round trip fewer per gapless
    transaction.

    Only where nothing else would see the difference: the connection is idle
    (no transaction yet), in no pipeline, with psycopg's default transaction
    characteristics (no ``isolation_level``, ``read_only`` or ``deferrable``,
    which psycopg writes into its own ``BEGIN``), and Django neither logs
    queries (``DEBUG``, ``assertNumQueries``) nor runs
    ``connection.execute_wrapper()`` hooks. None when it does not apply, or
    when no row matched; the caller then takes the ordinary path.
    """
    raw: Any = connection.connection
    pgconn = raw.pgconn
    if (
        pgconn.transaction_status != plan.idle
        or pgconn.pipeline_status
        or raw.autocommit
        or raw.isolation_level is not None
        or raw.read_only is not None
        or raw.deferrable is not None
        or connection.queries_logged
        or any(wrapper is not guard_inserts for wrapper in connection.execute_wrappers)
    ):
        return None
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    query = plan.joined.get(name)
    if query is None:
        from psycopg import sql

        assert plan.single is not None
        before, after = plan.single.split("%s")
        literal = sql.Literal(name).as_bytes(raw)
        encoding = raw.info.encoding
        query = b"BEGIN; " + before.encode(encoding) + literal + after.encode(encoding)
        if len(plan.joined) >= 64:  # one name per period of each serial: few in use at once
            plan.joined.clear()
        plan.joined[name] = query
    with connection.wrap_database_errors, raw.lock:  # psycopg's own lock, as its cursors take
        result = pgconn.exec_(query)
        if result.status != plan.tuples_ok:
            raise _error(result, raw.info.encoding)
    returned = result.get_value(0, 0) if result.ntuples else None
    taken: int | None = _gapless().single_value(True, returned, 1, None)
    return taken


def _error(result: Any, encoding: str) -> Exception:
    """The psycopg exception of a failed ``pgconn.exec_`` (its class by SQLSTATE)."""
    import psycopg
    from psycopg import errors, pq

    message = (result.error_message or b"").decode(encoding, "replace").strip()
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    if state is None:
        return psycopg.OperationalError(message or "the query failed with no message")
    try:
        kind = errors.lookup(state.decode())
    except KeyError:
        kind = psycopg.DatabaseError
    return kind(message)


def _plan(config: SequenceConfig, connection: BaseDatabaseWrapper) -> _Plan:
    """Check that ``connection`` can take gapless values, and keep what it needs."""
    alias = connection.alias
    settings, generation = conf.get(), sequences.generation()
    if not shares_transaction(connection):
        raise GaplessUnavailable(
            f"sequence {config.name!r} is gapless but its sequences live in database "
            f"{sequences.sequence_database(alias)!r}, not {alias!r} where the row is "
            "written; a gapless number must be in the same transaction as the row"
        )
    dialect = connection.vendor
    if dialect not in GAPLESS_VENDORS:
        raise GaplessUnavailable(
            f"sequence {config.name!r} is gapless but database {alias!r} is {dialect}, "
            "which gapless numbering does not support; use PostgreSQL, MariaDB/MySQL or "
            "SQLite, or drop gapless=True"
        )
    plan = _plans[connection] = _Plan(settings, generation, sequences.store(alias), dialect)
    return plan


_module: list[Any] = []


def _gapless() -> Any:
    """[`autoseq.stores.sql.gapless`][autoseq.stores.sql.gapless], imported on first use.

    It imports SQLAlchemy.
    """
    if not _module:
        from autoseq.stores.sql import gapless

        _module.append(gapless)
    return _module[0]


# django-sequences' reads and writes, in the caller's transaction -------------------


def gapless_row(
    name: str, connection: BaseDatabaseWrapper, *, nowait: bool = False, delete: bool = False
) -> Mapping[str, Any] | None:
    """Gapless row ``name`` as ``connection``'s transaction sees it; None when missing.

    ``nowait`` locks the row ``FOR UPDATE NOWAIT`` where the database can,
    so a row another transaction holds raises Django's ``DatabaseError`` at
    once, as django-sequences does. ``delete`` removes the row (the row
    returned is the deleted one).
    """
    from django.db import DatabaseError

    plan = _row_plan(name, connection)
    lock = nowait and connection.features.has_select_for_update_nowait
    gapless = _gapless()
    run = gapless.cursor_run(connection.cursor, plan.dialect)
    try:
        row: Mapping[str, Any] | None = gapless.read_row(
            run, plan.table, name, nowait=lock, delete=delete
        )
    except DatabaseError as exc:
        if plan.dialect == "sqlite" and gapless.sqlite_table_missing(exc):
            return None  # no gapless take made the table yet
        raise
    if delete and row is not None:
        gapless.forget_row(plan.store, name)
    return row


def restart_untouched_row(config: SequenceConfig, connection: BaseDatabaseWrapper) -> bool:
    """Give row ``config.name`` ``config``'s start, end and cycle if nothing was ever taken
    from it (version 0, current at start); True when it was rewritten.

    A row is created outside the caller's transaction on a server (see
    [`take_with`][autoseq.stores.sql.gapless.take_with]), so a rollback leaves it
    behind, untouched; the next caller's ``initial_value`` / ``reset_value`` are
    what django-sequences would have created it with.
    """
    from django.db import DatabaseError

    plan = _row_plan(config.name, connection)
    gapless = _gapless()
    run = gapless.cursor_run(connection.cursor, plan.dialect)
    try:
        restarted: bool = gapless.restart_untouched_row(run, plan.table, config)
    except DatabaseError as exc:
        if plan.dialect == "sqlite" and gapless.sqlite_table_missing(exc):
            return False
        raise
    return restarted


def watch_transaction(connection: BaseDatabaseWrapper) -> _Taken:
    """A token of ``connection``'s current transaction: ``given_back()`` once it rolled back."""
    token = _Taken(connection.alias)
    connection.on_commit(token)
    return token


def create_row_here(config: SequenceConfig, connection: BaseDatabaseWrapper) -> None:
    """Create row ``config`` in ``connection``'s transaction (it was deleted in it).

    Rows are otherwise created outside the caller's transaction, which
    cannot see a row this transaction deleted until it commits.
    """
    plan = _row_plan(config.name, connection)
    gapless = _gapless()
    gapless.create_row(gapless.cursor_run(connection.cursor, plan.dialect), plan.table, config)


def _row_plan(name: str, connection: BaseDatabaseWrapper) -> _Plan:
    plan = _plans.get(connection)
    if plan is None or plan.settings is not conf.get() or plan.generation != sequences.generation():
        plan = _plan(SequenceConfig(name), connection)
    return plan
