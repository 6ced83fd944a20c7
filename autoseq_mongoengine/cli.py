"""Adoption from a shell: ``autoseq mongo-adopt`` or ``python -m autoseq_mongoengine adopt``.

Example, for ``class Ticket(Document): id = SequenceField(primary_key=True)``
whose documents were numbered by mongoengine's own field::

    autoseq --url mongodb://host:27017/app mongo-adopt \\
        --sequence ticket --collection ticket --counter ticket.id

Bad input prints one line and exits with status 2, writing nothing; a
server that cannot be reached exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from autoseq.cli import add_setting_arguments, given_settings
from autoseq.config import SequenceConfig
from autoseq.errors import AutoseqError, InvalidSequenceConfig, StoreUnavailable

_NEW_ROW_SETTINGS = ("start", "end", "step", "batch_count")
HELP = "start a sequence after mongoengine's counter and the largest stored value"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the adopt arguments (the URL and sequence collection come from the caller)."""
    parser.add_argument("--sequence", required=True, help="the sequence name in sys_sequence")
    parser.add_argument("--collection", help="documents whose largest value to start after")
    parser.add_argument("--field", default="_id", help="the numbered field (default _id)")
    parser.add_argument("--counter", help="mongoengine counter _id to start after, e.g. ticket.id")
    parser.add_argument("--counters-collection", default="mongoengine.counters")
    parser.add_argument(
        "--strings", action="store_true", help="values are stored as strings (scans)"
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would change")
    notes = dict.fromkeys(_NEW_ROW_SETTINGS, "for a new row")
    add_setting_arguments(parser, _NEW_ROW_SETTINGS, defaults=True, notes=notes)


def run(args: argparse.Namespace) -> int:
    """Adopt as ``args`` say; raises ``AutoseqError`` for bad input or a failing server."""
    import pymongo
    from pymongo.errors import ConfigurationError, InvalidURI

    from autoseq.cli import CONNECT_TIMEOUT
    from autoseq.stores.mongo import check_documents, ping, validate_collection_name
    from autoseq_mongoengine.adoption import adopt_sequence, validate_field_name

    config = SequenceConfig(args.sequence, **given_settings(vars(args), _NEW_ROW_SETTINGS))
    documents = validate_collection_name(args.collection) if args.collection else None
    validate_field_name(args.field)
    validate_collection_name(args.counters_collection)
    validate_collection_name(args.sequence_table)
    if not args.url:
        raise InvalidSequenceConfig("no MongoDB URL; pass --url mongodb://host:27017/mydb")
    try:
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            args.url, serverSelectionTimeoutMS=int(CONNECT_TIMEOUT * 1000)
        )
    except (ConfigurationError, InvalidURI, ValueError) as exc:
        raise InvalidSequenceConfig(f"bad MongoDB URL {args.url!r}: {exc}") from None
    try:
        ping(client, args.url)
        try:
            database = client.get_default_database()
        except ConfigurationError:
            raise InvalidSequenceConfig(
                "name the database in the URL: mongodb://host:27017/mydb"
            ) from None
        if documents:
            check_documents(database, documents, args.field)
        result = adopt_sequence(
            database,
            config,
            documents=database[documents] if documents else None,
            field=args.field,
            counter_id=args.counter,
            counters_collection=args.counters_collection,
            sequence_collection=args.sequence_table,
            numeric_only=not args.strings,
            dry_run=args.dry_run,
        )
    finally:
        client.close()
    found = f"counter {result.counter}, largest {args.field} {result.max_value}"
    if not result.moved:
        outcome = f"next value {result.row.next_value} already follows them; nothing changed"
    elif args.dry_run:
        outcome = f"next value would become {result.row.next_value} (dry run, nothing written)"
    else:
        outcome = f"next value is now {result.row.next_value}"
    print(f"sequence {result.name!r}: {found}; {outcome}")
    return 0


def register_commands() -> None:
    """Add ``mongo-adopt`` to the ``autoseq`` command (the ``autoseq.cli`` entry point)."""
    from autoseq.cli import register

    register("mongo-adopt", HELP + " (--url mongodb://host/db)", run, configure)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoseq_mongoengine``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m autoseq_mongoengine")
    commands = parser.add_subparsers(dest="command", required=True)
    adopt = commands.add_parser("adopt", help=HELP)
    adopt.add_argument("--url", required=True, help="mongodb:// URL naming the database")
    adopt.add_argument("--sequence-collection", dest="sequence_table", default="sys_sequence")
    configure(adopt)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except StoreUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except AutoseqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
