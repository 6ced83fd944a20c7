"""The AUTOSEQ setting, and start-up without database access."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings

from autoseq import BufferPolicy, SequenceNotFound
from autoseq_django import registry as sequences
from django_tests.testapp.models import Parcel

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_fill_what_the_field_leaves_out() -> None:
    """DEFAULTS give a field's missing settings; the field's own arguments win."""
    with override_settings(AUTOSEQ={"DEFAULTS": {"start": 5000, "batch_count": 333}}):
        config = Parcel._meta.get_field("id").sequence_config
        invoice = sequences.conf.get().sequence_config("x", batch_count=7)
    assert (config.start, config.batch_count, config.step) == (5000, 333, 1)
    assert invoice.batch_count == 7


def test_buffer_policy_reaches_the_registry() -> None:
    """BUFFER arguments become the BufferPolicy of every sequence."""
    with override_settings(AUTOSEQ={"BUFFER": {"prefetch": False, "max_batch_count": 64}}):
        policy = sequences.registry("sqlite").policy
    assert policy == BufferPolicy(prefetch=False, max_batch_count=64)


def test_missing_row_without_auto_create(backend: str) -> None:
    """AUTO_CREATE=False: a missing row raises SequenceNotFound saying how to create it."""
    # migrate created every row of the test database: drop this one
    sequences.store(sequences.sequence_database(backend)).delete("testapp_parcel")
    sequences.reset()
    with override_settings(AUTOSEQ={"AUTO_CREATE": False}):
        with (
            pytest.raises(SequenceNotFound, match=r"manage\.py autoseq create testapp_parcel"),
            transaction.atomic(using=backend),
        ):
            Parcel.objects.using(backend).create()
        call_command("autoseq", "create", "testapp_parcel", "--start", "700", database=backend)
        assert Parcel.objects.using(backend).create().pk == 700


STARTUP = textwrap.dedent(
    """
    import json, os, sys
    opened = []
    def audit(event, args):
        if event == "sqlite3.connect":
            opened.append(str(args[0]))
    sys.addaudithook(audit)
    import django
    from django.conf import settings
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "autoseq_django", "django_tests.testapp"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
        AUTOSEQ={"PRELOAD": True},
        USE_TZ=True,
    )
    django.setup()
    at_setup = list(opened)
    from django.core.signals import request_started
    request_started.send(sender=None)
    from autoseq_django import registry as sequences
    rows = [row.name for row in sequences.store("default").read_all()]
    print(json.dumps({"at_setup": at_setup, "after_request": opened, "rows": rows}))
    """
)


def test_startup_touches_no_database(tmp_path: Path) -> None:
    """django.setup() opens no database, even with PRELOAD; the first request loads all."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "django")])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-c", STARTUP, str(tmp_path / "app.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["at_setup"] == []
    assert report["after_request"], "PRELOAD did not load on the first request"
    assert {"testapp_order", "tickets", "testapp_parcel"} <= set(report["rows"])
