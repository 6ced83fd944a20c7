"""The serials example (``python -m example_project.serials``) end to end, small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_example_numbers_orders_daily_and_invoices_without_gaps() -> None:
    """3 processes, a third of transactions rolled back: order numbers unique, invoices 1..K."""
    result = subprocess.run(
        [sys.executable, "-m", "example_project.serials", "--processes", "3", "--orders", "40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "order numbers repeated: 0" in result.stdout
    assert "ORD-" in result.stdout
    assert "INV-" in result.stdout
    assert ": yes" in result.stdout
