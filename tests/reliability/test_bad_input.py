"""Bad input: each case gets its specific exception and message, and nothing is written.

Every case runs against every store: the rows (and, on SQL, the tables) are
read raw before and after, and must be identical. Cases that edit a row by
hand first (as a person at a SQL or mongo prompt would) take the snapshot
after the edit: autoseq must refuse the row and leave it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from autoseq import (
    MAX_VALUE,
    BufferPolicy,
    InvalidSequenceConfig,
    SequenceConfig,
    SequenceExhausted,
    SequenceNotFound,
    SequenceRegistry,
    signals,
)
from autoseq.sqlalchemy import application_tables

from .harness import TALLIES


@dataclass
class Context:
    """What a case may touch: the target, a store on it, a registry without auto-creation."""

    target: Any
    store: Any
    registry: SequenceRegistry


@dataclass(frozen=True)
class Case:
    id: str
    attempt: Callable[[Context], object]
    error: type[Exception]
    match: str
    prepare: Callable[[Context], object] | None = None


def register(**settings: Any) -> Callable[[Context], object]:
    return lambda ctx: ctx.registry.register(SequenceConfig(**settings))


def edited(**fields: Any) -> Callable[[Context], object]:
    """A valid row 'edited' (three values served), then changed by hand to ``fields``."""

    def prepare(ctx: Context) -> None:
        ctx.store.create(SequenceConfig("edited", start=10, end=1000, step=5))
        ctx.store.reserve("edited", 3)
        ctx.target.write_raw("edited", **fields)

    return prepare


def exhaust(ctx: Context) -> None:
    lock = ctx.registry.register(SequenceConfig("short", end=3, batch_count=2))
    assert [lock.next() for _ in range(3)] == [1, 2, 3]


NAME_CASES = [
    ("name-none", None, "must be a str, got NoneType"),
    ("name-int", 42, "must be a str, got int"),
    ("name-bytes", b"orders", "must be a str, got bytes"),
    ("name-mongo-operator-dict", {"$gt": ""}, "must be a str, got dict"),
    ("name-list", ["orders"], "must be a str, got list"),
    ("name-empty", "", "must be non-empty"),
    ("name-padded", " orders", "no leading or trailing spaces"),
    ("name-too-long", "x" * 192, "192 characters long; the limit is 191"),
    ("name-nul", "a\x00b", "control character"),
    ("name-newline", "orders\n; DROP TABLE x", "control character"),
]

CASES = [
    Case("step-zero", register(name="s", step=0), InvalidSequenceConfig, "step must be 1 or more"),
    Case("step-negative", register(name="s", step=-3), InvalidSequenceConfig, "step=-3"),
    Case(
        "start-after-end",
        register(name="s", start=10, end=5),
        InvalidSequenceConfig,
        "start=10 is greater than end=5",
    ),
    Case(
        "batch-count-zero",
        register(name="s", batch_count=0),
        InvalidSequenceConfig,
        "batch_count must be 1 or more",
    ),
    Case(
        "batch-count-negative",
        register(name="s", batch_count=-5),
        InvalidSequenceConfig,
        "batch_count=-5",
    ),
    Case(
        "current-below-start",
        register(name="s", start=10, current=5),
        InvalidSequenceConfig,
        r"current=5 is outside \[start=10, end=",
    ),
    Case(
        "current-above-end",
        register(name="s", end=100, current=101),
        InvalidSequenceConfig,
        r"current=101 is outside \[start=1, end=100\]",
    ),
    Case(
        "current-off-step",
        register(name="s", step=10, current=5),
        InvalidSequenceConfig,
        r"current=5 is not start \+ k \* step",
    ),
    Case(
        "start-bool",
        register(name="s", start=True),
        InvalidSequenceConfig,
        "start must be an int, got bool",
    ),
    Case(
        "step-str",
        register(name="s", step="1"),
        InvalidSequenceConfig,
        "step must be an int, got str",
    ),
    Case(
        "end-float",
        register(name="s", end=1e6),
        InvalidSequenceConfig,
        "end must be an int, got float",
    ),
    Case(
        "end-past-int64",
        register(name="s", end=2**63),
        InvalidSequenceConfig,
        "does not fit a signed 64-bit integer",
    ),
    Case(
        "batch-not-bool",
        register(name="s", batch="yes"),
        InvalidSequenceConfig,
        "batch must be True or False",
    ),
    Case(
        "start-no-room",
        register(name="s", start=MAX_VALUE - 1, step=5),
        InvalidSequenceConfig,
        "leaves no room for one step",
    ),
    *[
        Case(case_id, lambda ctx, n=name: ctx.store.reserve(n, 1), InvalidSequenceConfig, match)
        for case_id, name, match in NAME_CASES
    ],
    Case(
        "name-via-registry",
        lambda ctx: ctx.registry.next({"$ne": None}),  # type: ignore[arg-type]
        InvalidSequenceConfig,
        "must be a str, got dict",
    ),
    Case(
        "name-via-read",
        lambda ctx: ctx.store.read({"$where": "1"}),  # type: ignore[arg-type]
        InvalidSequenceConfig,
        "must be a str, got dict",
    ),
    Case(
        "unknown-no-autocreate",
        lambda ctx: ctx.registry.next("ghost"),
        SequenceNotFound,
        "'ghost' does not exist; register it first",
    ),
    Case(
        "unknown-reserve",
        lambda ctx: ctx.store.reserve("ghost", 1),
        SequenceNotFound,
        "'ghost' does not exist",
    ),
    Case(
        "update-unknown",
        lambda ctx: ctx.store.update(SequenceConfig("ghost")),
        SequenceNotFound,
        "'ghost' does not exist",
    ),
    Case(
        "reserve-zero",
        lambda ctx: ctx.store.reserve("bystander", 0),
        InvalidSequenceConfig,
        "cannot reserve 0 values",
    ),
    Case(
        "next-many-negative",
        lambda ctx: ctx.registry.next_many("bystander", -1),
        InvalidSequenceConfig,
        "count of 0 or more, got -1",
    ),
    Case(
        "next-many-str",
        lambda ctx: ctx.registry.next_many("bystander", "3"),  # type: ignore[arg-type]
        InvalidSequenceConfig,
        "count of 0 or more, got '3'",
    ),
    Case(
        "policy-prefetch-share",
        lambda ctx: BufferPolicy(prefetch_at=2.0),
        InvalidSequenceConfig,
        "prefetch_at=2.0",
    ),
    Case(
        "store-source-int", lambda ctx: ctx.target.open_source(42), InvalidSequenceConfig, "got int"
    ),
    *[
        Case(
            f"table-name-{i}",
            lambda ctx, i=i: ctx.target.open_table(i),
            InvalidSequenceConfig,
            r"(table|collection) name .* (is not a plain identifier|is not usable)"
            r"|Redis key prefix .* must be 1 to 100 letters",
        )
        for i in range(5)
    ],
    Case(
        "row-current-below-start",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "row 'edited' is invalid: current=5 is not start",
        edited(current=5),
    ),
    Case(
        "row-current-off-step",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "row 'edited' is invalid: current=27",
        edited(current=27),
    ),
    Case(
        "row-current-far-past-end",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "row 'edited' is invalid: current=5000",
        edited(current=5000),
    ),
    Case(
        "row-step-zero",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "row 'edited' is invalid: sequence 'edited': step=0",
        edited(step=0),
    ),
    Case(
        "row-start-after-end",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "'edited': start=10 is greater than end=7",
        edited(end=7),
    ),
    Case(
        "row-batch-count-zero",
        lambda ctx: ctx.store.reserve("edited", 1),
        InvalidSequenceConfig,
        "'edited': batch_count=0",
        edited(batch_count=0),
    ),
    Case(
        "row-edited-then-registry",
        lambda ctx: ctx.registry.next("edited"),
        InvalidSequenceConfig,
        "row 'edited' is invalid",
        edited(current=-5),
    ),
    Case(
        "exhausted-no-cycle",
        lambda ctx: ctx.registry.next("short"),
        SequenceExhausted,
        "'short' is exhausted: next value 4 is past end 3; raise `end`",
        exhaust,
    ),
]


#: Known store bugs, (store, case) -> why; strict, so a fix shows up as XPASS.
KNOWN: dict[tuple[str, str], str] = {}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_and_nothing_written(
    target: Any, case: Case, request: pytest.FixtureRequest
) -> None:
    """The case raises its specific error with a message that says what is wrong; no row moves."""
    known = KNOWN.get((target.id, case.id))
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))
    store = target.open()
    store.create(SequenceConfig("bystander", start=100))
    store.reserve("bystander", 7)
    ctx = Context(target, store, SequenceRegistry(store, auto_create=False))
    if case.prepare is not None:
        case.prepare(ctx)
    before = target.rows()
    tables = target.tables()
    with pytest.raises(case.error, match=case.match):
        case.attempt(ctx)
    assert target.rows() == before, "a refused input changed a row"
    assert target.tables() == tables, "a refused input created or dropped a table"
    TALLIES.append({"store": target.id, "scenario": "bad input", "case": case.id})


def test_unknown_sequence_on_a_missing_table_writes_nothing(target: Any) -> None:
    """Reserving before any table or row exists: SequenceNotFound, and still no table."""
    store = target.open()
    tables = target.tables()
    with pytest.raises(SequenceNotFound, match="'ghost' does not exist"):
        store.reserve("ghost", 1)
    with pytest.raises(SequenceNotFound):
        SequenceRegistry(store).next("ghost")
    assert target.tables() == tables
    assert target.rows() == []


def test_cycle_wraps_at_end_instead_of_failing(target: Any) -> None:
    """Exhaustion with cycle: the sequence wraps to start, and says so once per wrap."""
    store = target.open()
    lock = SequenceRegistry(store).register(
        SequenceConfig("ring", end=3, cycle=True, batch_count=2)
    )
    cycled: list[dict[str, Any]] = []

    def receiver(sender: object, **kwargs: Any) -> None:
        cycled.append(kwargs)

    signals.sequence_cycled.connect(receiver)
    try:
        values = [lock.next() for _ in range(7)]
    finally:
        signals.sequence_cycled.disconnect(receiver)
    assert values == [1, 2, 3, 1, 2, 3, 1]
    assert [c["name"] for c in cycled] == ["ring", "ring"]


@pytest.mark.parametrize("explicit", ["abc", 1.5, True], ids=["str", "float", "bool"])
def test_explicit_non_integer_key_is_refused_by_the_sqlalchemy_integration(
    sql_target: Any, explicit: object
) -> None:
    """An explicit non-integer key gets InvalidSequenceConfig before anything is inserted."""
    import sqlalchemy as sa
    from backends import unique_table
    from sqlalchemy.orm import DeclarativeBase, mapped_column, sessionmaker

    from autoseq.sqlalchemy import SequenceField, install, uninstall

    class Base(DeclarativeBase):
        pass

    order: Any = type(
        "Order",
        (Base,),
        {
            "__tablename__": unique_table("orders"),
            "id": SequenceField(primary_key=True),
            "note": mapped_column(sa.String(10), default=""),
        },
    )
    engine = sa.create_engine(sql_target.url)
    Base.metadata.create_all(engine)
    maker = sessionmaker(engine)
    install(maker, store=sql_target.open())
    try:
        with maker() as session:
            session.add(order(id=explicit))
            with pytest.raises(InvalidSequenceConfig, match="must be an int"):
                session.commit()
        with maker() as session:
            assert session.execute(sa.select(sa.func.count()).select_from(order)).scalar() == 0
    finally:
        uninstall(maker)
        Base.metadata.drop_all(engine, tables=application_tables(Base.metadata))
        engine.dispose()
