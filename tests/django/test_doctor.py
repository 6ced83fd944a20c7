"""``manage.py autoseq doctor`` and ``check --deploy`` on every backend."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from autoseq import maintenance as core
from autoseq_django import doctor
from autoseq_django import registry as sequences
from django_tests.testapp.models import Invoice


def run_doctor(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("autoseq", "doctor", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def move_back(backend: str, name: str, value: int) -> None:
    """What a restore of an old sys_sequence does: current falls behind the keys in use."""
    alias = sequences.sequence_database(backend)
    sequences.forget(alias, name)  # first: its prefetch in flight would land after the move
    core.set_current(sequences.store(alias), name, value, force=True)


def sync(backend: str) -> None:
    call_command("autoseq", "sync", "testapp_invoice", "--database", backend, stdout=StringIO())


def test_doctor_finds_a_sequence_behind_max_id_from_the_models(backend: str) -> None:
    """Columns come from the models: a sequence behind max(id) is an error, exit status 1."""
    top = Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(5)])[-1].pk
    try:
        move_back(backend, "testapp_invoice", 1)
        status, out = run_doctor("testapp_invoice", "--database", backend, "--json")
        assert status == 1, out
        report: dict[str, Any] = json.loads(out)
        (sequence,) = report["sequences"]
        assert sequence["status"] == "error"
        assert sequence["current"] == 1
        assert {"column": "testapp.Invoice.id", "max": top} in sequence["columns"]
        (behind,) = [f for f in report["findings"] if f["check"] == "behind"]
        assert behind["level"] == "error"
        assert str(top) in behind["message"]
    finally:
        sync(backend)
    status, out = run_doctor("testapp_invoice", "--database", backend)
    assert status == 0, out
    assert "testapp_invoice  ok" in out


def test_deploy_check_reports_what_doctor_finds(backend: str) -> None:
    """check --deploy turns the doctor's error into autoseq.E101 and fails the check."""
    Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(3)])
    try:
        move_back(backend, "testapp_invoice", 1)
        messages = doctor.check_doctor(databases=[backend])
        behind = [m for m in messages if "testapp_invoice" in m.msg]
        assert [m.id for m in behind] == ["autoseq.E101"]
        with pytest.raises(SystemCheckError, match=r"autoseq\.E101"):
            call_command(
                "check", "--deploy", "--tag", "database", "--database", backend, stdout=StringIO()
            )
    finally:
        sync(backend)
    after = doctor.check_doctor(databases=[backend])
    assert not [m for m in after if "testapp_invoice" in m.msg]


def test_doctor_uses_the_rate_this_process_measured(backend: str) -> None:
    """The rate of a running process (its stats) gives the time to end in the report."""
    for _ in range(3):
        Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(20)])
    report = doctor.report(backend, names=["testapp_invoice"])
    (sequence,) = report.sequences
    assert sequence.values_left is not None
    if sequence.rate is not None:  # two reservations are needed to measure a rate
        assert sequence.seconds_to_end == pytest.approx(sequence.values_left / sequence.rate)
