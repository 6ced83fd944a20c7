"""``autoseq``: look after ``sys_sequence`` rows from the command line.

::

    autoseq --url URL [--sequence-table T] init | list | create NAME [...] |
            set NAME VALUE [--force] | change NAME [--step S ...] |
            sync NAME (--table T --column C | --past VALUE)

``URL`` is a SQLAlchemy URL, ``mongodb://host/db``, ``redis://host/db`` or
``redis+cluster://host:port[,host:port...]`` (a Redis Cluster);
every write goes through [`autoseq.maintenance`][autoseq.maintenance] (a compare-and-set on
the row's version).

Bad input gets one line on stderr and exit status 2, with nothing written
(a typo in a table, collection or field, a SQLite path with no database, a
URL scheme or driver autoseq cannot use); a store that fails (server down,
3 s for MongoDB) gets exit status 1. ``--url`` defaults to
``$AUTOSEQ_URL``. Only the standard library and the core are imported up
front; SQLAlchemy is imported by the commands that use it.

Other packages add subcommands with `register`, from a function listed
under the ``autoseq.cli`` entry-point group (called with no arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, NoReturn

from autoseq.config import (
    CHANGEABLE_SETTINGS,
    SETTING_NAMES,
    SETTINGS_BY_NAME,
    SequenceConfig,
    validate_name,
)
from autoseq.errors import (
    AutoseqError,
    InvalidSequenceConfig,
    InvalidStoredRow,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.errors import UsageError as UsageError  # its home before 0.x: autoseq.cli
from autoseq.stores.capabilities import CreatesTable, KnowsFiles, Locates, ReadsColumnMax

if TYPE_CHECKING:
    from autoseq.stores.base import SequenceStore

PROG = "autoseq"


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


#: The driver autoseq installs for each SQL database a URL may name without one.
SQL_SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
ACCEPTED_URLS = (
    "sqlite:///PATH, postgresql://, mysql://, mariadb:// (optionally +driver), "
    "mongodb://, mongodb+srv://, redis://, rediss://, redis+cluster://, rediss+cluster://"
)
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
#: Seconds the command line waits for a server: a person is waiting.
CONNECT_TIMEOUT = 3.0


def open_store(args: argparse.Namespace) -> SequenceStore:
    """The store ``--url`` names (SQL, ``mongodb://``, ``redis://``) with ``--sequence-table``."""
    url = _url(args)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("mongodb", "mongodb+srv"):
        return _open_mongo(url, args.sequence_table)
    if scheme in REDIS_SCHEMES:
        try:
            from autoseq.stores.redis import RedisStore
        except ImportError:
            raise UsageError("redis:// URLs need redis-py: pip install 'autoseq[redis]'") from None
        return RedisStore(url, prefix=args.sequence_table)
    return _open_sql(_sql_url(url, scheme), args.sequence_table)


def _sql_url(url: str, scheme: str) -> str:
    """``url`` with the driver autoseq installs where it names none (``postgres://``)."""
    backend, plus, _ = scheme.partition("+")
    if backend not in SQL_SCHEMES:
        raise UsageError(
            f"--url {scheme or url!r}:// is not a URL autoseq reads; use {ACCEPTED_URLS}"
        )
    if plus:
        return url
    return SQL_SCHEMES[backend] + url[len(scheme) :]


def _open_mongo(url: str, collection: str) -> SequenceStore:
    try:
        from autoseq.stores.mongo import MongoStore, ping
    except ImportError:
        raise UsageError(
            "mongodb:// URLs need pymongo: pip install 'autoseq[mongoengine]'"
        ) from None
    try:
        store = MongoStore(url, collection=collection, timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        if isinstance(exc, AutoseqError):
            raise
        raise UsageError(f"cannot use --url {url!r}: {exc}") from None
    try:
        ping(store.collection.database.client, url)
    except StoreUnavailable:
        store.close()
        raise
    return store


def _open_sql(url: str, table: str) -> SequenceStore:
    try:
        import sqlalchemy.exc
    except ImportError:
        raise UsageError(
            "the SQL commands need SQLAlchemy: pip install 'autoseq[sqlalchemy]'"
        ) from None
    from autoseq.stores.sql import SQLStore, check_driver

    try:
        _check_sqlite_file(sqlalchemy.engine.make_url(url))
        check_driver(url)  # says which extra to install
        return SQLStore(url, table=table)
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError) as exc:
        raise UsageError(f"cannot use --url {url!r}: {exc}") from None


def _check_sqlite_file(url: Any) -> None:
    """Refuse a SQLite path with neither a database nor rows, before the store makes a file.

    The rows would go to an orphan ``PATH.autoseq`` beside no application (a
    typo in the path); the application creates its database, not autoseq.
    Rows already in a companion whose database is gone are still served.
    """
    from autoseq.stores.sql import store_url

    if url.get_backend_name() != "sqlite":
        return
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    companion = store_url(url)[0].database or ""
    if not os.path.exists(database) and not os.path.exists(companion):
        raise UsageError(f"no SQLite database at {database}; create it first (or check the path)")


def _has_table(store: SequenceStore) -> bool:
    """Whether a sequence row can exist, without creating an empty SQLite file."""
    return store.rows_may_exist() if isinstance(store, KnowsFiles) else True


def _read(store: SequenceStore, name: str) -> SequenceConfig:
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
    """Values not yet reserved before ``end``: ``row.values_left`` (kept for callers)."""
    return row.values_left


def _where(store: SequenceStore) -> str:
    return store.location() if isinstance(store, Locates) else type(store).__name__


# subcommands -----------------------------------------------------------------


def _run_init(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        if isinstance(store, CreatesTable):
            store.create_table()  # also adds the version column to a table made before it
        else:
            store.read_all()  # MongoDB and Redis need no table; check the server answers
        print(f"{args.sequence_table} is ready in {_where(store)}")
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
        print(f"no sequences in {args.sequence_table}")
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
            str(row.values_left),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [_HEADERS, *table]) for i in range(len(_HEADERS))]
    for cells in [_HEADERS, *table]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        )
    return 0


def add_setting_arguments(
    parser: argparse.ArgumentParser,
    names: Sequence[str] = SETTING_NAMES,
    *,
    defaults: bool,
    notes: Mapping[str, str] | None = None,
) -> None:
    """Add ``--start``, ``--batch-count``, ``--cycle/--no-cycle`` ... for ``names``.

    Built from `autoseq.config.SETTINGS`. With ``defaults`` an option
    left out takes the setting's default (a new row); without, it is None,
    "not given" (a change, or a default from elsewhere: read them with
    `given_settings`). ``notes`` adds to a setting's help.
    """
    for name in names:
        setting = SETTINGS_BY_NAME[name]
        help_text = setting.help
        if notes and name in notes:
            help_text += f" ({notes[name]})"
        if defaults:
            help_text += f" (default {setting.describe_default()})"
        if setting.type is bool:
            parser.add_argument(
                setting.option,
                action=argparse.BooleanOptionalAction,
                default=setting.default if defaults else None,
                help=help_text,
            )
        else:
            parser.add_argument(
                setting.option,
                type=int,
                default=setting.default if defaults else None,
                help=help_text,
            )


def given_settings(
    values: Mapping[str, Any], names: Sequence[str] = SETTING_NAMES
) -> dict[str, Any]:
    """The settings among ``values`` (parsed options) that were given (not None)."""
    return {name: values[name] for name in names if values.get(name) is not None}


def _configure_create(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    add_setting_arguments(parser, defaults=True)


def _run_create(args: argparse.Namespace) -> int:
    config = SequenceConfig(args.name, **given_settings(vars(args)))
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


def add_change_options(parser: argparse.ArgumentParser) -> None:
    """The options of `change` (and of `set` beside its value): every changeable setting."""
    add_setting_arguments(
        parser,
        CHANGEABLE_SETTINGS,
        defaults=False,
        notes={"step": "current moves onto the new grid"},
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return given_settings(vars(args), CHANGEABLE_SETTINGS)


def _configure_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    parser.add_argument("value", type=int, help="the next value to hand out")
    parser.add_argument(
        "--force",
        action="store_true",
        help="allow moving backwards (values already handed out would come again), "
        "or repair a row that fails validation",
    )
    add_change_options(parser)


def _run_set(args: argparse.Namespace) -> int:
    from autoseq import maintenance

    changes = _settings(args)
    store = open_store(args)
    try:
        before = _read_or_repairable(store, args.name)
        try:
            if changes:
                maintenance.change(
                    store, args.name, current=args.value, force=args.force, **changes
                )
            else:
                maintenance.set_current(store, args.name, args.value, force=args.force)
        except InvalidStoredRow:
            if not args.force:
                raise
            maintenance.repair(store, args.name, args.value, **changes)
        row = _read(store, args.name)
    finally:
        store.close()
    print(f"sequence {args.name!r}{_unchanged(before, row)}: next value {row.next_value}")
    return 0


def _read_or_repairable(store: SequenceStore, name: str) -> SequenceConfig | None:
    """The row, None when it fails validation (set --force repairs it)."""
    with contextlib.suppress(InvalidStoredRow):
        return _read(store, name)
    return None


def _unchanged(before: SequenceConfig | None, after: SequenceConfig) -> str:
    """`` is unchanged`` when no write reached the row, which a command must not hide.

    Every write bumps the version, so an equal version means the row is as
    it was (already there, or nothing to do); ``after`` is read back from
    the store, so what is printed is the row serving uses.
    """
    return " is unchanged" if before is not None and after.version == before.version else ""


def _configure_change(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    add_change_options(parser)


def _run_change(args: argparse.Namespace) -> int:
    from autoseq import maintenance

    changes = _settings(args)
    if not changes:
        raise UsageError("nothing to change; pass --end, --step, --batch-count, --batch or --cycle")
    store = open_store(args)
    try:
        before = _read(store, args.name)
        maintenance.change(store, args.name, **changes)
        row = _read(store, args.name)
    finally:
        store.close()
    print(
        f"sequence {row.name!r}{_unchanged(before, row)}: next value {row.next_value}, "
        f"end {row.end}, step {row.step}, "
        f"batch_count {row.batch_count}, batch {'yes' if row.batch else 'no'}, "
        f"cycle {'yes' if row.cycle else 'no'}"
    )
    return 0


def _configure_sync(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=_name, help="sequence name")
    parser.add_argument(
        "--table", help="SQL table (or MongoDB collection) whose rows use the sequence"
    )
    parser.add_argument("--column", help="the column (or document field) holding the values")
    parser.add_argument("--past", type=int, help="move past this value instead (any store)")


def _run_sync(args: argparse.Namespace) -> int:
    from autoseq import maintenance

    if args.past is None and not (args.table and args.column):
        raise UsageError("pass --table T --column C, or --past VALUE")
    store = open_store(args)
    try:
        before = _read(store, args.name)  # unknown sequence: fail before touching the table
        if args.past is not None:
            highest: int | None = args.past
            source = str(args.past)
        else:
            highest = column_max(store, args.table, args.column)
            source = f"max({args.table}.{args.column}) = {highest}"
        if highest is None:
            print(f"{args.table} is empty; sequence {args.name!r} is unchanged")
            return 0
        maintenance.sync(store, args.name, highest)
        row = _read(store, args.name)
    finally:
        store.close()
    print(f"sequence {args.name!r}{_unchanged(before, row)}: {source}, next value {row.next_value}")
    return 0


def past(row: SequenceConfig, highest: int) -> int:
    """The first value of ``row``'s series (start + k * step) above ``highest``."""
    return row.first_value_after(highest)


def column_max(store: SequenceStore, table_name: str, column_name: str) -> int | None:
    """``max()`` of a column (SQL) or field (MongoDB) of the store's database."""
    if not isinstance(store, ReadsColumnMax):
        raise UsageError("--table/--column need a SQL or MongoDB --url; use --past VALUE")
    return store.column_max(table_name, column_name)


register("init", "create the sequence table if it is missing", _run_init)
register("list", "show every sequence", _run_list)
register("create", "create a sequence", _run_create, _configure_create)
register("set", "set the next value a sequence hands out", _run_set, _configure_set)
register(
    "change",
    "change end, step, batch, batch_count or cycle, keeping values unique",
    _run_change,
    _configure_change,
)
register(
    "sync",
    "move a sequence past max(column) of a table that already has rows",
    _run_sync,
    _configure_sync,
)
