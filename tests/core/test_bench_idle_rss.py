"""The many_sequences benchmark's RSS per idle sequence (issue 34) can pass and can fail.

It is measured in a fresh interpreter above a baseline taken once the
process's one-time costs are paid (`benchmarks.suites.many_sequences.idle_rss`):
what each sequence keeps must still show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.suites.many_sequences import MAX_BYTES_PER_IDLE, ROOT, Rows, fresh_rss

#: Each lock of the child keeps this many more bytes (a bytearray, zero-filled: touched).
PAD = 5 * 1024

PADDED = f"""
import autoseq.lock
from benchmarks.suites.many_sequences import main

pads = []
init = autoseq.lock.SequenceLock.__init__

def padded(self, *args, **kwargs):
    init(self, *args, **kwargs)
    pads.append(bytearray({PAD}))

autoseq.lock.SequenceLock.__init__ = padded
main(__import__("sys").argv[1:])
"""


def test_rss_per_idle_sequence_shows_what_each_lock_keeps(tmp_path: Path) -> None:
    """2,000 SQLite sequences holding their first block read under 4 KB each, and over it
    when every lock keeps 5 KB more."""
    url = f"sqlite:///{tmp_path / 'many.db'}"
    rows = Rows(url, 2_000)
    try:
        plain = fresh_rss(url, rows.store.table_name)
        done = subprocess.run(
            [sys.executable, "-c", PADDED, url, rows.store.table_name],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        padded = json.loads(done.stdout.splitlines()[-1])
    finally:
        rows.drop()
    assert plain["prefetch threads"] == padded["prefetch threads"] == 4
    assert plain["holding"] < MAX_BYTES_PER_IDLE, plain
    assert padded["holding"] > MAX_BYTES_PER_IDLE, padded
    assert padded["holding"] - plain["holding"] > PAD * 0.9, (plain, padded)
