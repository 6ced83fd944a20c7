"""``manage.py autoseq`` has every verb and option of the standalone ``autoseq``."""

from __future__ import annotations

import argparse
import json
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from autoseq.cli import build_parser
from autoseq_django.management.commands.autoseq import Command
from django_tests.helpers import stored_current
from django_tests.testapp.models import Order

#: Standalone options manage.py has no use for, and why (anything else missing fails).
NOT_IN_DJANGO = {
    "--url": "--database ALIAS names the database (its settings give the URL)",
    "--sequence-table": "the table is the SysSequence model's (sys_sequence)",
    "doctor --column": "the columns come from the installed models' fields",
    "doctor --metadata": "SQLAlchemy metadata: Django's models are the metadata",
}
#: Verbs other packages add to the standalone (entry points), not autoseq's own.
PLUGIN_VERBS = {"mongo-adopt"}
#: manage.py's own options (Django's and --database).
DJANGO_OWN = {
    "--database",
    "--version",
    "--verbosity",
    "-v",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def options(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    """Every verb path and option string of ``parser``, as "verb --option"."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                if verb in PLUGIN_VERBS:
                    continue
                found.add(f"{prefix}{verb}")
                found |= options(sub, f"{prefix}{verb} ")
        else:
            found |= {f"{prefix}{o}" for o in action.option_strings if o not in ("-h", "--help")}
    return found


def test_every_standalone_verb_and_option_is_in_manage_py() -> None:
    """The two parsers differ only by the listed options: a new one on either side fails."""
    standalone = options(build_parser())
    django = {
        o
        for o in options(Command().create_parser("manage.py", "autoseq"))
        if o.split()[-1] not in DJANGO_OWN
    }
    assert standalone - django == set(NOT_IN_DJANGO)
    # apply writes the fields' settings to their rows: only Django has fields to read.
    assert django - standalone == {"apply"}


def run(*args: str) -> str:
    out = StringIO()
    call_command("autoseq", *args, stdout=out)
    return out.getvalue()


def fresh_name() -> str:
    return f"par_{uuid.uuid4().hex[:10]}"


def test_change_moves_settings_and_refuses_nothing(backend: str) -> None:
    """change writes end and batch_count; with no setting it says what to pass."""
    name = fresh_name()
    run("create", name, "--start", "1", "--database", backend)
    output = run("change", name, "--end", "5000", "--batch-count", "7", "--database", backend)
    assert "end 5000" in output
    assert "batch_count 7" in output
    with pytest.raises(CommandError, match="nothing to change; pass --end") as caught:
        run("change", name, "--database", backend)
    assert caught.value.returncode == 2


def test_set_takes_the_change_options(backend: str) -> None:
    """set NAME VALUE --end E moves current and end in one compare-and-set."""
    name = fresh_name()
    run("create", name, "--start", "1", "--database", backend)
    run("set", name, "40", "--end", "900", "--database", backend)
    assert stored_current(backend, name) == 40
    assert "end 900" in run("change", name, "--batch-count", "3", "--database", backend)


def test_sync_past_a_value(backend: str) -> None:
    """sync NAME --past V puts current past V; it never moves back."""
    name = fresh_name()
    run("create", name, "--start", "1", "--database", backend)
    assert "current 1001" in run("sync", name, "--past", "1000", "--database", backend)
    assert "unchanged" in run("sync", name, "--past", "10", "--database", backend)
    assert stored_current(backend, name) == 1001
    with pytest.raises(CommandError, match="pass one NAME with --past VALUE"):
        run("sync", name, "other", "--past", "5", "--database", backend)


def test_sync_past_a_table_column(backend: str) -> None:
    """sync NAME --table T --column C reads max() of that column; a typo is refused."""
    name = fresh_name()
    run("create", name, "--start", "1", "--database", backend)
    top = max(Order.objects.using(backend).create().pk for _ in range(3))
    output = run("sync", name, "--table", "testapp_order", "--column", "id", "--database", backend)
    assert f"max(testapp_order.id) = {top}" in output
    assert stored_current(backend, name) == top + 1
    with pytest.raises(CommandError, match="has no column 'nope'"):
        run("sync", name, "--table", "testapp_order", "--column", "nope", "--database", backend)
    with pytest.raises(CommandError, match="table 'no_such' does not exist"):
        run("sync", name, "--table", "no_such", "--column", "id", "--database", backend)


def test_hints_name_manage_py(backend: str) -> None:
    """The doctor's hints name `manage.py autoseq ...`, never the standalone command."""
    name = fresh_name()
    run("create", name, "--start", "1", "--end", "100", "--database", backend)
    run("sync", name, "--past", "100", "--database", backend)  # exhausted
    out = StringIO()
    with pytest.raises(CommandError, match="status error"):
        call_command("autoseq", "doctor", name, "--database", backend, stdout=out)
    output = out.getvalue()
    assert f"`manage.py autoseq change {name} --end E`" in output
    assert "`autoseq " not in output


def test_snowflake_decode_and_workers(backend: str) -> None:
    """snowflake decode and workers run the standalone's code on the Django database."""
    output = run("snowflake", "decode", "384286390961045504", "--json")
    assert set(json.loads(output)) == {"timestamp", "worker", "sequence"}
    workers = run("workers", "--database", backend).splitlines()[0]
    assert workers.startswith(("no worker leases", "name "))


def test_init_is_idempotent(backend: str) -> None:
    """init makes sure the table is there; run twice it is still fine."""
    assert "sys_sequence is ready" in run("init", "--database", backend)
    assert "sys_sequence is ready" in run("init", "--database", backend)
