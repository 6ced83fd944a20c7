"""``manage.py autoseq list | create | set | sync | apply | doctor``: a database's sequences."""

from __future__ import annotations

import argparse
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from autoseq import AutoseqError
from autoseq.cli import add_setting_arguments, given_settings
from autoseq_django import conf, maintenance, sequences

_HELP_DATABASE = (
    "the database whose rows the sequences serve (default: default); its sequences live "
    "in AUTOSEQ['DATABASE'], a routed database, or the database itself"
)


class Command(BaseCommand):
    help = "List, create, move and sync the sequences in sys_sequence."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def action(name: str, help_text: str) -> argparse.ArgumentParser:
            sub = actions.add_parser(name, help=help_text, description=help_text)
            sub.add_argument("--database", default=DEFAULT_DB_ALIAS, help=_HELP_DATABASE)
            return sub

        action("list", "Show every sequence: current, end, values left, the columns using it.")
        create = action("create", "Create a sequence row (it must not exist yet).")
        create.add_argument("name")
        # Unset options come from AUTOSEQ["DEFAULTS"], then from the core's defaults.
        add_setting_arguments(create, defaults=False)
        move = action(
            "set",
            "Set current (the next value to reserve): forward only, never at or below "
            "max() of a column using the sequence, never past end.",
        )
        move.add_argument("name")
        move.add_argument("value", type=int)
        move.add_argument(
            "--force",
            action="store_true",
            help="allow moving back (stop every process using the sequence first)",
        )
        sync = action(
            "sync",
            "Move each sequence past max() of the columns that use it (after loaddata or a "
            "migration from AutoField), like sqlsequencereset.",
        )
        sync.add_argument("names", nargs="*", metavar="NAME", help="only these sequences")
        doctor = action(
            "doctor",
            "Check each sequence: behind max() of its columns, invalid rows, values left and "
            "time to end, the SQLite companion file. Exit status 1 when something is wrong.",
        )
        doctor.add_argument("names", nargs="*", metavar="NAME", help="only these sequences")
        doctor.add_argument("--json", action="store_true", help="print the report as JSON")
        doctor.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
        doctor.add_argument(
            "--sample", type=float, default=0.0, help="seconds to watch current for a rate"
        )
        doctor.add_argument(
            "--warn-days", type=float, default=30.0, help="warn when end is nearer (days)"
        )

        apply = action(
            "apply",
            "Write the fields' settings (end, step, batch, batch_count, cycle, a later start) "
            "to their stored rows: check autoseq.W002 names the rows that differ.",
        )
        apply.add_argument("names", nargs="*", metavar="NAME", help="only these sequences")

    def handle(self, *args: Any, **options: Any) -> None:
        database = options["database"]
        if database not in settings.DATABASES:
            raise CommandError(
                f"unknown database {database!r}; DATABASES has "
                f"{', '.join(map(repr, settings.DATABASES))}",
                returncode=2,
            )
        try:
            sequence_alias = sequences.sequence_database(database)
            getattr(self, f"_{options['action']}")(sequence_alias, **options)
        except AutoseqError as exc:
            raise CommandError(str(exc), returncode=2) from exc

    def _list(self, sequence_alias: str, **options: Any) -> None:
        rows = sequences.store(sequence_alias).read_all()
        if not rows:
            self.stdout.write(f"no sequences in database {sequence_alias!r}")
            return
        header = ("NAME", "CURRENT", "END", "STEP", "BATCH", "CYCLE", "LEFT", "USED BY")
        lines = [header]
        for row in rows:
            left = "cycles" if row.cycle else f"{row.values_left:,}"
            used = ", ".join(f"{f.model._meta.label}.{f.name}" for f in maintenance.users(row.name))
            lines.append(
                (
                    row.name,
                    str(row.next_value),
                    str(row.end),
                    str(row.step),
                    str(row.batch_count) if row.batch else "no",
                    "yes" if row.cycle else "no",
                    left,
                    used or "-",
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        for line in lines:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            )

    def _create(self, sequence_alias: str, **options: Any) -> None:
        config = conf.get().sequence_config(options["name"], **given_settings(options))
        store = sequences.store(sequence_alias)
        if store.read(config.name) is not None:
            raise CommandError(
                f"sequence {config.name!r} exists already; use `autoseq set` to move it",
                returncode=2,
            )
        row = store.create(config)
        self.stdout.write(f"created {row.name!r}: current={row.next_value} end={row.end}")

    def _set(self, sequence_alias: str, **options: Any) -> None:
        name, value = options["name"], options["value"]
        before = maintenance.read(sequence_alias, name)
        row = maintenance.change(sequence_alias, name, {"current": value}, force=options["force"])
        if row.version == before.version:  # no write reached the row: never say it moved
            self.stdout.write(f"{name!r}: current {row.next_value}, unchanged")
        else:
            self.stdout.write(f"{name!r}: current {before.next_value} -> {row.next_value}")

    def _sync(self, sequence_alias: str, **options: Any) -> None:
        results = maintenance.sync(options["database"], names=options["names"] or None)
        if not results:
            self.stdout.write(f"no model in database {options['database']!r} uses a sequence")
        for result in results:
            top = "empty" if result.column_max is None else f"max={result.column_max}"
            moved = (
                f"current {result.old} -> {result.new}"
                if result.new != result.old
                else f"current {result.old} already past it"
            )
            self.stdout.write(f"{result.name!r} ({', '.join(result.columns)}: {top}): {moved}")

    def _doctor(self, sequence_alias: str, **options: Any) -> None:
        from autoseq_django import doctor

        if options["sample"] < 0 or options["warn_days"] < 0:
            raise CommandError("--sample and --warn-days must be 0 or more", returncode=2)
        report = doctor.report(
            options["database"],
            sample=options["sample"],
            warn_seconds=options["warn_days"] * 86400,
            names=options["names"] or None,
        )
        self.stdout.write(report.to_json() if options["json"] else report.to_text())
        if report.exit_code(strict=options["strict"]):
            raise CommandError(f"autoseq doctor: status {report.status}", returncode=1)

    def _apply(self, sequence_alias: str, **options: Any) -> None:
        results = maintenance.apply(options["database"], names=options["names"] or None)
        for result in results:
            if not result.stored:
                self.stdout.write(f"{result.name!r}: no row yet; the field creates it on first use")
            elif not result.changed:
                self.stdout.write(f"{result.name!r}: already as the fields say")
                continue
            changed = ", ".join(
                f"{'current' if key == 'current' else key} {old} -> {new}"
                for key, (old, new) in result.changed.items()
            )
            self.stdout.write(f"{result.name!r} ({', '.join(result.columns)}): {changed}")
