"""The snowflake subcommands of ``autoseq``: ``snowflake decode VALUE`` and ``workers``.

Registered by `autoseq.cli` when it loads (it passes its ``register``,
so this module never imports the half-loaded CLI module).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoseq.snowflake import DEFAULT_EPOCH, decode


def _epoch(text: str) -> datetime | int:
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--epoch {text!r}: give an ISO date (2024-01-01T00:00:00+00:00) or milliseconds"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _value(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer id") from None


def _configure_snowflake(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    decoder = actions.add_parser("decode", help="show the timestamp, worker id and sequence")
    decoder.add_argument("value", type=_value, metavar="VALUE")
    decoder.add_argument(
        "--epoch",
        type=_epoch,
        default=DEFAULT_EPOCH,
        help="the layout's epoch: ISO date or ms since 1970 (default: 2024-01-01 UTC)",
    )
    decoder.add_argument("--worker-bits", type=int, default=10)
    decoder.add_argument("--sequence-bits", type=int, default=12)
    decoder.add_argument("--json", action="store_true", help="print one JSON object")


def _run_snowflake(args: argparse.Namespace) -> int:
    parts = decode(
        args.value,
        epoch=args.epoch,
        worker_bits=args.worker_bits,
        sequence_bits=args.sequence_bits,
    )
    stamp = parts.timestamp.isoformat(timespec="milliseconds")
    if args.json:
        print(json.dumps({"timestamp": stamp, "worker": parts.worker, "sequence": parts.sequence}))
    else:
        print(f"timestamp  {stamp}\nworker     {parts.worker}\nsequence   {parts.sequence}")
    return 0


def _configure_workers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", help="only this snowflake layout (default: every one)")


_HEADERS = ("name", "worker", "state", "owner", "expires", "last_issued")


def _moment(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _run_workers(args: argparse.Namespace) -> int:
    from autoseq.cli.app import open_store
    from autoseq.errors import InvalidSnowflakeConfig, UsageError
    from autoseq.workers import worker_leases

    store = open_store(args)
    try:
        try:
            rows = worker_leases(store).list_workers(args.name)
        except InvalidSnowflakeConfig as exc:
            raise UsageError(str(exc)) from None
    finally:
        store.close()
    if not rows:
        print("no worker leases" + (f" for {args.name!r}" if args.name else ""))
        return 0
    now = time.time_ns() // 1_000_000
    table = [
        (
            row.name,
            str(row.worker),
            "free" if row.owner is None else ("held" if row.expires_ms >= now else "expired"),
            row.owner or "-",
            _moment(row.expires_ms) if row.owner else "-",
            _moment(row.last_ms),
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [_HEADERS, *table]) for i in range(len(_HEADERS))]
    for cells in [_HEADERS, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return 0


def register_commands(register: Callable[..., Any]) -> None:
    """Add ``snowflake`` and ``workers`` to the ``autoseq`` command line."""
    register("snowflake", "snowflake ids: decode VALUE", _run_snowflake, _configure_snowflake)
    register("workers", "list snowflake worker-id leases", _run_workers, _configure_workers)
