"""``manage.py autoseq``: a database's sequences, with every verb of the standalone ``autoseq``.

``init | list | create | set | change | sync | apply | doctor | snowflake | workers``;
``--database ALIAS`` stands for the standalone ``--url`` (and the table is
the ``SysSequence`` model's). Hints in errors name ``manage.py autoseq``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from autoseq import AutoseqError
from autoseq.cli import COMMANDS, add_change_options, add_setting_arguments, given_settings
from autoseq.config import CHANGEABLE_SETTINGS
from autoseq_django import columns, conf, doctor, maintenance
from autoseq_django import registry as sequences

_HELP_DATABASE = (
    "the database whose rows the sequences serve (default: default); its sequences live "
    "in AUTOSEQ['DATABASE'], a routed database, or the database itself"
)


class Command(BaseCommand):
    help = "List, create, move and sync the sequences in sys_sequence."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="verb", required=True, metavar="ACTION")

        def action(name: str, help_text: str) -> argparse.ArgumentParser:
            sub = actions.add_parser(name, help=help_text, description=help_text)
            sub.add_argument("--database", default=DEFAULT_DB_ALIAS, help=_HELP_DATABASE)
            return sub

        action("init", "Create the sequence table if it is missing (migrates the autoseq app).")
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
        add_change_options(move)
        change = action(
            "change",
            "Change end, step, batch, batch_count or cycle of a sequence, keeping values unique.",
        )
        change.add_argument("name")
        add_change_options(change)
        sync = action(
            "sync",
            "Move each sequence past max() of the columns that use it (after loaddata or a "
            "migration from AutoField), like sqlsequencereset.",
        )
        sync.add_argument("names", nargs="*", metavar="NAME", help="only these sequences")
        sync.add_argument(
            "--past", type=int, help="move the one NAME past this value instead of its columns"
        )
        sync.add_argument("--table", help="move the one NAME past max() of this table's --column")
        sync.add_argument("--column", help="the column of --table holding the values")
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
        doctor.add_argument(
            "--warn-share",
            type=float,
            default=0.9,
            help="warn when this share of a sequence's range is reserved (0.9)",
        )
        for name in ("snowflake", "workers"):
            # The standalone's own arguments: one definition, no drift.
            core = COMMANDS[name]
            sub = action(name, core.help)
            assert core.configure is not None
            core.configure(sub)

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
            getattr(self, f"_{options['verb']}")(sequence_alias, **options)
        except AutoseqError as exc:
            raise CommandError(django_hints(str(exc)), returncode=2) from exc

    def _init(self, sequence_alias: str, **options: Any) -> None:
        from django.core.management import call_command

        call_command("migrate", "autoseq", database=sequence_alias, verbosity=0)
        sequences.store(sequence_alias).create_table()  # SQLite: the companion file's table
        self.stdout.write(f"sys_sequence is ready in database {sequence_alias!r}")

    def _change(self, sequence_alias: str, **options: Any) -> None:
        changes = given_settings(options, CHANGEABLE_SETTINGS)
        if not changes:
            raise CommandError(
                "nothing to change; pass --end, --step, --batch-count, --batch or --cycle",
                returncode=2,
            )
        name = options["name"]
        before = maintenance.read(sequence_alias, name)
        row = maintenance.change(sequence_alias, name, changes)
        state = ", unchanged" if row.version == before.version else ""
        self.stdout.write(
            f"{name!r}{state}: current {row.next_value}, end {row.end}, step {row.step}, "
            f"batch_count {row.batch_count}, batch {'yes' if row.batch else 'no'}, "
            f"cycle {'yes' if row.cycle else 'no'}"
        )

    def _snowflake(self, sequence_alias: str, **options: Any) -> None:
        self._run_core("snowflake", sequence_alias, options)

    def _workers(self, sequence_alias: str, **options: Any) -> None:
        self._run_core("workers", sequence_alias, options)

    def _run_core(self, name: str, sequence_alias: str, options: dict[str, Any]) -> None:
        """The standalone command ``name`` on the store of ``sequence_alias``."""
        url = sequences.database_url(sequence_alias).render_as_string(hide_password=False)
        args = argparse.Namespace(**options, url=url, sequence_table="sys_sequence")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = COMMANDS[name].run(args)
        self.stdout.write(django_hints(out.getvalue()), ending="")
        if status:
            raise CommandError(f"autoseq {name}: status {status}", returncode=status)

    def _list(self, sequence_alias: str, **options: Any) -> None:
        rows = sequences.store(sequence_alias).read_all()
        if not rows:
            self.stdout.write(f"no sequences in database {sequence_alias!r}")
            return
        header = ("NAME", "CURRENT", "END", "STEP", "BATCH", "CYCLE", "LEFT", "USED BY")
        lines = [header]
        for row in rows:
            left = "cycles" if row.cycle else f"{row.values_left:,}"
            used = ", ".join(f"{f.model._meta.label}.{f.name}" for f in columns.users(row.name))
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
        changes = {"current": value, **given_settings(options, CHANGEABLE_SETTINGS)}
        row = maintenance.change(sequence_alias, name, changes, force=options["force"])
        if row.version == before.version:  # no write reached the row: never say it moved
            self.stdout.write(f"{name!r}: current {row.next_value}, unchanged")
        else:
            self.stdout.write(f"{name!r}: current {before.next_value} -> {row.next_value}")

    def _sync(self, sequence_alias: str, **options: Any) -> None:
        if options["past"] is not None or options["table"] or options["column"]:
            self._sync_past(sequence_alias, options)
            return
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
        if options["sample"] < 0 or options["warn_days"] < 0 or not 0 < options["warn_share"] <= 1:
            raise CommandError(
                "--sample and --warn-days must be 0 or more, --warn-share in (0, 1]",
                returncode=2,
            )
        report = doctor.report(
            options["database"],
            sample=options["sample"],
            warn_seconds=options["warn_days"] * 86400,
            warn_share=options["warn_share"],
            names=options["names"] or None,
        )
        text = report.to_json() if options["json"] else report.to_text()
        self.stdout.write(django_hints(text))
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

    def _sync_past(self, sequence_alias: str, options: dict[str, Any]) -> None:
        """``sync NAME --past VALUE`` or ``sync NAME --table T --column C``, as the standalone."""
        from autoseq import maintenance as core

        names, past, table, column = (options[k] for k in ("names", "past", "table", "column"))
        if (
            len(names) != 1
            or (past is not None) == bool(table and column)
            or bool(table) != bool(column)
        ):
            raise CommandError(
                "pass one NAME with --past VALUE, or with --table T --column C", returncode=2
            )
        store = sequences.store(sequence_alias)
        before = maintenance.read(sequence_alias, names[0])
        if past is None:
            past = column_max(options["database"], table, column)
            source = f"max({table}.{column}) = {past}"
            if past is None:
                self.stdout.write(f"{table} is empty; {names[0]!r} is unchanged")
                return
        else:
            source = str(past)
        row = core.sync(store, names[0], past)
        sequences.forget(sequence_alias, names[0])
        state = ", unchanged" if row.version == before.version else ""
        self.stdout.write(f"{names[0]!r}{state}: {source}, current {row.next_value}")


def column_max(database: str, table: str, column: str) -> int | None:
    """``max(table.column)`` in ``database``, both names checked against the schema first."""
    from django.db import connections

    connection = connections[database]
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            raise CommandError(
                f"table {table!r} does not exist in database {database!r}", returncode=2
            )
        known = [c.name for c in connection.introspection.get_table_description(cursor, table)]
        if column not in known:
            raise CommandError(
                f"table {table!r} has no column {column!r} ({', '.join(known)})", returncode=2
            )
        quote = connection.ops.quote_name
        cursor.execute(f"SELECT MAX({quote(column)}) FROM {quote(table)}")  # noqa: S608 - checked
        value = cursor.fetchone()[0]
    return None if value is None else int(value)


def django_hints(text: str) -> str:
    """``text`` with the standalone's hints (`` `autoseq set ...` ``) as ``manage.py autoseq``."""
    return text.replace("`autoseq ", "`manage.py autoseq ")
