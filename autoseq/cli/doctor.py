"""``autoseq doctor``: the command line of [`autoseq.doctor`][autoseq.doctor]."""

from __future__ import annotations

from typing import Any

from autoseq import doctor
from autoseq.cli.app import open_store
from autoseq.errors import UsageError

HELP = "check every sequence: behind max(column), invalid rows, values left, store settings"


def configure_cli(parser: Any) -> None:
    """Arguments of ``autoseq doctor``."""
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these sequences")
    parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="TABLE.COLUMN[=SEQUENCE]",
        help="a column (MongoDB: collection.field) using a sequence (default: the sequence "
        "named after the table); repeat for each",
    )
    parser.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="find the columns in SQLAlchemy metadata (a MetaData, a declarative base or a "
        "Table), e.g. myapp.models:Base",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 on warnings too, not only on errors"
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="watch current this long to measure each sequence's rate (default 0: no rate)",
    )
    parser.add_argument(
        "--warn-days",
        type=float,
        default=doctor.WARN_SECONDS / 86400,
        metavar="DAYS",
        help="warn when a sequence reaches end sooner than this at the measured rate (30)",
    )
    parser.add_argument(
        "--warn-share",
        type=float,
        default=doctor.WARN_SHARE,
        metavar="SHARE",
        help="warn when this share of a sequence's range is reserved (0.9)",
    )


def run_cli(args: Any) -> int:
    """``autoseq doctor``: print the report; 0 fine, 1 something is wrong, 2 bad input."""
    if args.sample < 0 or not 0 < args.warn_share <= 1 or args.warn_days < 0:
        raise UsageError("--sample and --warn-days must be 0 or more, --warn-share in (0, 1]")
    store = open_store(args)
    try:
        columns = [*doctor.column_hints(store, args.column)]
        for spec in args.metadata:
            columns.extend(doctor.metadata_columns(store, spec))
        report = doctor.examine(
            store,
            columns,
            sample=args.sample,
            warn_share=args.warn_share,
            warn_seconds=args.warn_days * 86400,
            names=args.names or None,
        )
    finally:
        store.close()
    print(report.to_json() if args.json else report.to_text())
    return report.exit_code(strict=args.strict)
