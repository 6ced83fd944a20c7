"""``autoseq``: look after ``sys_sequence`` rows from the command line.

::

    autoseq --url URL [--sequence-table T] init | list | create NAME [...] |
            set NAME VALUE [--force] | sync NAME --table T --column C

Bad input gets one line on stderr and exit status 2, with nothing written; a
store that fails (server down) gets exit status 1. ``--url`` defaults to
``$AUTOSEQ_URL``. Only the standard library and the core are imported up
front; SQLAlchemy is imported by the commands that use it.

Other packages add subcommands with :func:`register`, from a function listed
under the ``autoseq.cli`` entry-point group (called with no arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, NoReturn

from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import AutoseqError, InvalidSequenceConfig, SequenceNotFound, StoreUnavailable

if TYPE_CHECKING:
    from autoseq.stores.sql import SQLStore

PROG = "autoseq"


class UsageError(AutoseqError):
    """The command line asks for something that cannot be done (exit status 2)."""


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: ``configure`` adds its arguments, ``run`` does it and returns the status."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    configure: Callable[[argparse.ArgumentParser], None] | None = None


COMMANDS: dict[str, Command] = {}


def register(
    name: str,
    help: str,
    run: Callable[[argparse.Namespace], int],
    configure: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Add (or replace) subcommand ``name``."""
    COMMANDS[name] = Command(name, help, run, configure)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the message says what to fix.
        self.exit(2, f"{PROG}: error: {message} (see `{PROG} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser with every registered subcommand (plugins included)."""
    _load_plugins()
    parser = _Parser(prog=PROG, description="Manage autoseq's sys_sequence rows.")
    parser.add_argument(
        "--url",
        default=os.environ.get("AUTOSEQ_URL"),
        help="database URL (default: $AUTOSEQ_URL); on SQLite the rows live in <db>.autoseq",
    )
    parser.add_argument(
        "--sequence-table",
        default="sys_sequence",
        metavar="NAME",
        help="name of the sequence table (default: sys_sequence)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for command in COMMANDS.values():
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        if command.configure is not None:
            command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 store failed, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        status: int = args.run(args)
        return status
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else 2
    except StoreUnavailable as exc:
        _fail(exc)
        return 1
    except AutoseqError as exc:
        _fail(exc)
        return 2


def _fail(exc: BaseException) -> None:
    text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{PROG}: error: {text}", file=sys.stderr)


def _load_plugins() -> None:
    for entry in entry_points(group="autoseq.cli"):
        try:
            entry.load()()
        except ImportError:
            continue  # the plugin's optional dependencies are not installed


# opening the store ---------------------------------------------------------------


def _url(args: argparse.Namespace) -> str:
    if not args.url:
        raise UsageError("no database URL; pass --url URL or set AUTOSEQ_URL")
    return str(args.url)


def open_store(args: argparse.Namespace) -> SQLStore:
    """The ``SQLStore`` named by ``--url`` and ``--sequence-table``."""
    try:
        import sqlalchemy.exc
    except ImportError:  # pragma: no cover - the sqlalchemy extra is missing
        raise UsageError(
            "the SQL commands need SQLAlchemy: pip install 'autoseq[sqlalchemy]'"
        ) from None
    from autoseq.stores.sql import SQLStore

    url = _url(args)
    try:
        return SQLStore(url, table=args.sequence_table)
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as exc:
        raise UsageError(f"cannot use --url {url!r}: {exc}") from None
    except ImportError as exc:
        raise UsageError(f"the driver for --url {url!r} is not installed: {exc}") from None


def _has_table(store: SQLStore) -> bool:
    """Whether the sequence table can exist, without creating an empty SQLite file."""
    database = store.url.database
    if store.dialect == "sqlite" and database and database != ":memory:":
        return os.path.exists(database)
    return True


def _read(store: SQLStore, name: str) -> SequenceConfig:
    row = store.read(name) if _has_table(store) else None
    if row is None:
        raise SequenceNotFound(name, f"create it first: `{PROG} create {name}`")
    return row


def _name(value: str) -> str:
    try:
        return validate_name(value)
    except InvalidSequenceConfig as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def values_left(row: SequenceConfig) -> int:
    """Values not yet reserved before ``end`` (a cycling sequence starts over after)."""
    if row.next_value > row.last_value:
        return 0
    return (row.last_value - row.next_value) // row.step + 1


def _move_current(store: SQLStore, name: str, decide: Callable[[SequenceConfig], int]) -> int:
    """Set ``current`` to ``decide(row)`` with a compare-and-set; returns the new value.

    A reservation that lands between the read and the write makes the write
    miss, and the decision is taken again on the fresh row, so a concurrent
    process can never be moved behind.
    """
    import sqlalchemy as sa

    table = store.table
    for _ in range(50):
        row = _read(store, name)
        new = decide(row)
        if new == row.next_value:
            return new
        row.with_current(new)  # validates the target before anything is written
        try:
            with store.engine.begin() as connection:
                moved = connection.execute(
                    sa.update(table)
                    .where(table.c.name == name, table.c.current == row.next_value)
                    .values(current=new, updated_at=datetime.now(UTC))
                ).rowcount
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailable(f"updating sequence {name!r} failed: {exc.orig}") from exc
        if moved == 1:
            return new
    raise StoreUnavailable(f"sequence {name!r} kept moving; try again when it is quieter")


# subcommands -----------------------------------------------------------------


def _run_init(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        store.create_table()
        where = store.url.render_as_string(hide_password=True)
        print(f"table {store.table_name} is ready in {where}")
    finally:
        store.close()
    return 0


_HEADERS = ("name", "current", "end", "step", "batch", "batch_count", "cycle", "values_left")


def _run_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        rows = store.read_all() if _has_table(store) else []
    finally:
        store.close()
    if not rows:
        print(f"no sequences in {store.table_name}")
        return 0
    table = [
        (
            row.name,
            str(row.next_value),
            str(row.end),
            str(row.step),
            "yes" if row.batch else "no",
            str(row.batch_count),
            "yes" if row.cycle else "no",
            str(values_left(row)),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [_HEADERS, *table]) for i in range(len(_HEADERS))]
    for cells in [_HEADERS, *table]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        )
    return 0


def _configure_create(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    parser.add_argument("--start", type=int, default=1, help="first value (default 1)")
    parser.add_argument("--end", type=int, default=MAX_VALUE, help="last value (default 2**63-1)")
    parser.add_argument("--step", type=int, default=1, help="increment (default 1)")
    parser.add_argument(
        "--batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reserve batch_count values per round trip (default) or one",
    )
    parser.add_argument(
        "--batch-count", type=int, default=100, help="values per reservation (default 100)"
    )
    parser.add_argument(
        "--cycle",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="wrap from end back to start instead of failing (default: no)",
    )


def _run_create(args: argparse.Namespace) -> int:
    config = SequenceConfig(
        args.name,
        start=args.start,
        end=args.end,
        step=args.step,
        batch=args.batch,
        batch_count=args.batch_count,
        cycle=args.cycle,
    )
    store = open_store(args)
    try:
        if _has_table(store) and store.read(config.name) is not None:
            raise UsageError(
                f"sequence {config.name!r} already exists; change it with `{PROG} set`"
            )
        row = store.create(config)
    finally:
        store.close()
    print(f"created sequence {row.name!r}: next value {row.next_value}, step {row.step}")
    return 0


def _configure_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    parser.add_argument("value", type=int, help="the next value to hand out")
    parser.add_argument(
        "--force",
        action="store_true",
        help="allow moving backwards (values already handed out would come again)",
    )


def _run_set(args: argparse.Namespace) -> int:
    value: int = args.value

    def decide(row: SequenceConfig) -> int:
        row.replace(current=value)  # InvalidSequenceConfig: outside [start, end] or off-step
        if value < row.next_value and not args.force:
            raise UsageError(
                f"{value} is behind sequence {row.name!r} (next value {row.next_value}); values "
                "up to there may be in use. Pass --force if you know they are not"
            )
        return value

    store = open_store(args)
    try:
        new = _move_current(store, args.name, decide)
    finally:
        store.close()
    print(f"sequence {args.name!r}: next value {new}")
    return 0


def _configure_sync(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    parser.add_argument(
        "--table", required=True, help="the table whose rows use the sequence ([schema.]name)"
    )
    parser.add_argument("--column", required=True, help="the column holding the values")


def _run_sync(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        _read(store, args.name)  # unknown sequence: fail before touching the table
        highest = _column_max(store, args.table, args.column)
        if highest is None:
            print(f"{args.table} is empty; sequence {args.name!r} is unchanged")
            return 0

        def decide(row: SequenceConfig) -> int:
            target = past(row, highest)
            if target > row.last_value:
                raise UsageError(
                    f"max({args.table}.{args.column}) is {highest}, at or past the last value "
                    f"of sequence {row.name!r} (end={row.end}); raise its end first"
                )
            return max(target, row.next_value)

        new = _move_current(store, args.name, decide)
    finally:
        store.close()
    print(f"sequence {args.name!r}: max({args.table}.{args.column}) = {highest}, next value {new}")
    return 0


def past(row: SequenceConfig, highest: int) -> int:
    """The first value of ``row``'s series (start + k * step) above ``highest``."""
    if highest < row.start:
        return row.start
    return row.start + ((highest - row.start) // row.step + 1) * row.step


def _column_max(store: SQLStore, table_name: str, column_name: str) -> int | None:
    import sqlalchemy as sa
    from sqlalchemy.exc import NoSuchTableError

    from autoseq.stores.sql import validate_table_name

    *schema, name = table_name.split(".")
    if len(schema) > 1:
        raise UsageError(f"--table {table_name!r}: use name or schema.name")
    try:
        for part in [*schema, name]:
            validate_table_name(part)
    except InvalidSequenceConfig as exc:
        raise UsageError(f"--table: {exc}") from None
    app_url = store.app_url
    if app_url.get_backend_name() == "sqlite":
        database = app_url.database or ""
        if database in ("", ":memory:") or not os.path.exists(database):
            raise UsageError(f"--url names no existing SQLite database file ({database!r})")
    engine = sa.create_engine(app_url)
    try:
        try:
            table = sa.Table(
                name, sa.MetaData(), schema=schema[0] if schema else None, autoload_with=engine
            )
        except NoSuchTableError:
            raise UsageError(f"table {table_name!r} does not exist in that database") from None
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailable(f"reading table {table_name!r} failed: {exc.orig}") from exc
        column = table.columns.get(column_name)
        if column is None:
            known = ", ".join(c.name for c in table.columns)
            raise UsageError(f"table {table_name!r} has no column {column_name!r} ({known})")
        if not isinstance(column.type, sa.Integer):
            raise UsageError(f"column {table_name}.{column_name} is {column.type}, not an integer")
        with engine.connect() as connection:
            value: Any = connection.execute(sa.select(sa.func.max(column))).scalar()
    finally:
        engine.dispose()
    return None if value is None else int(value)


register("init", "create the sequence table if it is missing", _run_init)
register("list", "show every sequence", _run_list)
register("create", "create a sequence", _run_create, _configure_create)
register("set", "set the next value a sequence hands out", _run_set, _configure_set)
register(
    "sync",
    "move a sequence past max(column) of a table that already has rows",
    _run_sync,
    _configure_sync,
)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
