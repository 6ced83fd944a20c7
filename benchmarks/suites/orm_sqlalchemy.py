"""ORM insert throughput, SQLAlchemy: autoseq's ``SequenceField`` vs the database's own key.

Peers: ``autoincrement`` (SERIAL / AUTO_INCREMENT / SQLite rowid), on
PostgreSQL ``Identity()``, and keys the caller sets (a plain BIGINT key; on
SQLite an INTEGER rowid key, SequenceField's own type there, and beside it
a BIGINT one, the type SequenceField had before issue 31), the floor for any
generator of explicit keys: the same rows with one more bound parameter each.
Two insert paths, each in chunks of 10,000 rows committed per chunk: the
unit of work (``session.add_all`` + commit) and the ORM bulk insert
(``session.execute(insert(Model), [dicts])``). The
contenders' trials run chunk by chunk in turn (``run_stepped``), so both
sides of a ratio meet the same moments of the machine. Tables are emptied
before each trial (untimed) so every trial starts alike; after each trial the
rows are counted and their keys checked for duplicates.

Issue 16's target, recorded as a check per group: >= 0.97x keys the caller
sets in a column of SequenceField's own type (BIGINT; INTEGER, the rowid, on
SQLite). Issue 31's, on SQLite: >= 0.97x ``autoincrement``, now that the key
is the rowid as the database's own key is (a BIGINT key adds a unique index).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import Any

from benchmarks.harness import Group, Stepped, Steps, Unavailable, run_stepped
from benchmarks.servers import BACKEND_LABELS, Context, emptying_sql, unique_name

CHUNK = 10_000


def _integration() -> Any:
    try:
        import autoseq.sqlalchemy as integration
    except ImportError as exc:
        raise Unavailable(f"autoseq.sqlalchemy cannot be imported: {exc}") from exc
    return integration


class Setup:
    """The models of one backend, on unique tables, and a sessionmaker with autoseq installed."""

    def __init__(self, ctx: Context, backend: str) -> None:
        import sqlalchemy as sa
        from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

        from autoseq.stores import SQLStore

        integration = _integration()
        self.backend = backend
        self.engine = sa.create_engine(ctx.sql_url(backend))
        self.store = SQLStore(self.engine, table=unique_name("sys"))
        self.store.create_table()
        big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: rowid alias

        class Base(DeclarativeBase):
            pass

        def payload() -> dict[str, Any]:
            return {
                "name": mapped_column(sa.String(50)),
                "amount": mapped_column(sa.Integer),
                "__annotations__": {"id": Mapped[int], "name": Mapped[str], "amount": Mapped[int]},
            }

        self.models: dict[str, Any] = {}
        self.models["autoseq SequenceField"] = type(
            "AutoseqRow",
            (Base,),
            {
                "__tablename__": unique_name("sa_autoseq"),
                "id": integration.SequenceField(sequence=unique_name("s"), primary_key=True),
                **payload(),
            },
        )
        self.models["autoincrement"] = type(
            "NativeRow",
            (Base,),
            {
                "__tablename__": unique_name("sa_native"),
                "id": mapped_column(big, primary_key=True, autoincrement=True),
                **payload(),
            },
        )
        # The floor for any generator of explicit keys: the caller sets them.
        self.models["caller-set keys"] = type(
            "ExplicitRow",
            (Base,),
            {
                "__tablename__": unique_name("sa_explicit"),
                "id": mapped_column(big, primary_key=True, autoincrement=False),
                "explicit_keys": itertools.count(1),
                **payload(),
            },
        )
        if backend == "sqlite":
            # The same floor with the type SequenceField had before issue 31:
            # on SQLite a BIGINT key is not the rowid, so every row also goes
            # into a unique index, which the INTEGER floor above does not pay.
            self.models["caller-set keys, BIGINT"] = type(
                "ExplicitBigRow",
                (Base,),
                {
                    "__tablename__": unique_name("sa_explicit_big"),
                    "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
                    "explicit_keys": itertools.count(1),
                    **payload(),
                },
            )
        if backend == "postgres":
            self.models["Identity()"] = type(
                "IdentityRow",
                (Base,),
                {
                    "__tablename__": unique_name("sa_identity"),
                    "id": mapped_column(sa.BigInteger, sa.Identity(), primary_key=True),
                    **payload(),
                },
            )
        self.metadata = Base.metadata
        # Only the benchmark's own tables: the store here is on a table of its own, and the
        # declared default sys_sequence of a shared server is not the benchmark's to drop.
        self.own_tables = integration.application_tables(self.metadata)
        self.metadata.create_all(self.engine, tables=self.own_tables)
        self.Session = sessionmaker(self.engine)
        integration.install(self.Session, store=self.store)
        self.integration = integration

    def start(self, model: Any, n: int, insert: Callable[[Any, Any, int, int], None]) -> Steps:
        """Empty ``model``'s table (untimed) and cut a trial of ``n`` rows into chunks."""
        empty(self.engine, model)
        before = self.store.reservations

        def part(start: int, stop: int) -> None:
            insert(self.Session, model, start, stop)

        def finish() -> dict[str, float]:
            reservations = self.store.reservations - before
            verify(self.engine, model, n)
            return {"reservations": reservations}

        return Steps.chunks(n, CHUNK, part, finish)

    def close(self) -> None:
        self.integration.uninstall(self.Session)
        with contextlib.suppress(Exception):
            self.metadata.drop_all(self.engine, tables=self.own_tables)
        self.store.drop()
        self.store.close()
        self.engine.dispose()


def empty(engine: Any, model: Any) -> None:
    """Empty ``model``'s table (untimed, before a trial; see ``emptying_sql``)."""
    import sqlalchemy as sa

    with engine.begin() as connection:
        dialect = connection.dialect
        name = dialect.identifier_preparer.format_table(model.__table__)
        connection.execute(sa.text(emptying_sql(dialect.name, name)))


def verify(engine: Any, model: Any, n: int) -> None:
    """Raise unless ``model``'s table holds ``n`` rows with ``n`` distinct ``id`` keys."""
    import sqlalchemy as sa

    table = model.__table__
    with engine.connect() as connection:
        rows, keys = connection.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(table.c.id)))
        ).one()
    if rows != n or keys != n:
        raise AssertionError(f"{table.name}: {rows} rows, {keys} distinct keys, expected {n}")


def _rows(model: Any, start: int, stop: int) -> list[dict[str, Any]]:
    """The fields of rows ``start..stop``; the caller-set contenders add their own key.

    The model is asked once per chunk whether it sets keys, not once per row:
    a failed ``getattr`` raises and swallows an AttributeError inside, about
    0.1 us that every contender without ``explicit_keys`` paid per row, on
    top of the work being measured.
    """
    keys = getattr(model, "explicit_keys", None)
    if keys is None:
        return [{"name": f"row {i}", "amount": i} for i in range(start, stop)]
    return [{"name": f"row {i}", "amount": i, "id": next(keys)} for i in range(start, stop)]


def unit_of_work(maker: Any, model: Any, start: int, stop: int) -> None:
    with maker() as session:
        session.add_all([model(**fields) for fields in _rows(model, start, stop)])
        session.commit()


def orm_bulk(maker: Any, model: Any, start: int, stop: int) -> None:
    import sqlalchemy as sa

    with maker() as session:
        session.execute(sa.insert(model), _rows(model, start, stop))
        session.commit()


PATHS = {"session.add_all + commit": unit_of_work, "ORM bulk insert(Model), [dicts]": orm_bulk}


def run(ctx: Context) -> list[Group]:
    n = ctx.n(100_000, 5_000)
    groups: list[Group] = []
    for backend in ("sqlite", "postgres", "mysql"):
        label = BACKEND_LABELS[backend]
        made = [
            Group(
                "orm",
                f"SQLAlchemy {path}, {label}",
                "rows/s",
                subject="autoseq SequenceField",
            )
            for path in PATHS
        ]
        try:
            setup = Setup(ctx, backend)
        except Unavailable as exc:
            for group in made:
                group.unavailable = str(exc)
            groups.extend(made)
            continue
        try:
            for group, insert in zip(made, PATHS.values(), strict=True):
                run_stepped(
                    group,
                    [
                        Stepped(name, functools.partial(setup.start, model, n, insert))
                        for name, model in setup.models.items()
                    ],
                    ctx.insert_repeats,
                    log=ctx.log,
                )
                group.notes.append(
                    f"{n:,} rows per trial in chunks of {CHUNK:,}, interleaved chunk by chunk"
                )
                # Issue 16's floor: the same column type with keys the caller sets.
                ctx.floor_check(group, "caller-set keys", "autoincrement")
                if backend == "sqlite":
                    rowid_check(ctx, group)
        finally:
            setup.close()
        groups.extend(made)
    return groups


def rowid_check(ctx: Context, group: Group) -> None:
    """Issue 31: on SQLite the key is the rowid, so >= 0.97x the database's own key."""
    ratio = group.ratio("autoincrement")
    if ratio is None:
        return
    ctx.check(
        f"issue 31: {group.title} >= 0.97x autoincrement",
        ratio[0] >= 0.97,
        f"{ratio[0]:.2f}x (repeats {ratio[1]:.2f}..{ratio[2]:.2f})",
    )
