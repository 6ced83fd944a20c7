"""The example shop (``make example``) end to end, small: SQLite, companion alias, admin."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_example_project_runs_clean() -> None:
    """Two processes insert orders through the ORM; no duplicate, admin pages answer 200."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    command = ["-m", "example_project", "--only", "django", "--processes", "2", "--orders", "300"]
    result = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "inserted 600 orders" in result.stdout
    assert "duplicates found: 0" in result.stdout
    assert "/admin/autoseq/syssequence/ 200" in result.stdout
    assert "order_numbers" in result.stdout
    assert "order references (daily serial, from blocks): 600" in result.stdout
    assert "gaps: none" in result.stdout
    assert "/admin/orders/invoice/ 200" in result.stdout
    assert_reservations_add_up(result.stdout, orders=600)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def assert_reservations_add_up(output: str, orders: int) -> None:
    """The example explains ``current``: keys used plus blocks skipped is what was reserved."""
    current = re.search(r"orders_order\s+current=(\d+)", output)
    explained = re.search(
        r"orders_order: ([\d,]+) keys used \(largest ([\d,]+)\) of ([\d,]+) reserved; "
        r"the other ([\d,]+) are blocks",
        output,
    )
    assert current, output
    assert explained, output
    used, largest, reserved, other = (number(g) for g in explained.groups())
    assert used == orders
    assert reserved == int(current.group(1)) - 1  # the sequence starts at 1
    assert used + other == reserved
    assert largest <= reserved
