"""``autoseq doctor`` on the example shop: healthy after the demo, an error after a bad restore."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, data_dir: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    if data_dir is not None:
        env["AUTOSEQ_EXAMPLE_DIR"] = data_dir
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def shop() -> Iterator[str]:
    """The example shop's data directory after a small demo run (kept, removed afterwards)."""
    demo = run(
        "-m", "example_project", "--only", "django", "--processes", "1", "--orders", "200", "--keep"
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    found = re.search(r"files kept in (\S+)", demo.stdout)
    assert found, demo.stdout
    yield found.group(1)
    shutil.rmtree(found.group(1), ignore_errors=True)


def test_doctor_finds_the_example_shop_healthy(shop: str) -> None:
    """After the demo every sequence is past max() of its column: exit status 0."""
    result = run("example_project/manage.py", "autoseq", "doctor", "--json", data_dir=shop)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    statuses = {s["name"]: s["status"] for s in report["sequences"]}
    references = [
        n for n in statuses if re.fullmatch(r"orders_order\.reference:\d{4}-\d\d-\d\d", n)
    ]
    assert references, statuses  # the day's ORD-YYYYMMDD-NNNNN row
    # The year's gapless invoice row, kept in example.db itself (not the companion).
    invoices = [n for n in statuses if re.fullmatch(r"orders_invoice\.number:\d{4}", n)]
    assert invoices, statuses
    assert statuses == {"order_numbers": "ok", "orders_order": "ok"} | dict.fromkeys(
        references + invoices, "ok"
    )
    cli = run(
        "-m",
        "autoseq.cli",
        "--url",
        f"sqlite:///{shop}/example.db",
        "doctor",
        "--column",
        "orders_order.id",
        "--column",
        "orders_order.number=order_numbers",
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert cli.stdout.splitlines()[-1] == "status: ok (0 errors, 0 warnings)"


def test_doctor_and_deploy_check_fail_after_restoring_an_old_companion(shop: str) -> None:
    """A companion moved back under the keys in use fails doctor and check --deploy (E101)."""
    restored = f"{shop}-restored"
    shutil.copytree(shop, restored)
    try:
        moved = run(
            "-m",
            "autoseq.cli",
            "--url",
            f"sqlite:///{restored}/example.db",
            "set",
            "orders_order",
            "1",
            "--force",
        )
        assert moved.returncode == 0, moved.stderr
        doctor = run("example_project/manage.py", "autoseq", "doctor", data_dir=restored)
        assert doctor.returncode == 1
        assert re.search(r"^orders_order\s+error\s+1\s", doctor.stdout, re.MULTILINE), doctor.stdout
        deploy = run(
            "example_project/manage.py",
            "check",
            "--deploy",
            "--database",
            "default",
            data_dir=restored,
        )
        assert deploy.returncode == 1
        assert "(autoseq.E101) sequence 'orders_order'" in deploy.stderr
        # Without --database, as Django's own database checks, it does not run.
        static = run("example_project/manage.py", "check", "--deploy", data_dir=restored)
        assert "autoseq.E101" not in static.stderr
    finally:
        shutil.rmtree(restored, ignore_errors=True)
