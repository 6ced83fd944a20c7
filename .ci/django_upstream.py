"""Django's own test apps with ``SequenceAutoField`` as the default key, then ``BigAutoField``.

Usage: ``python .ci/django_upstream.py DJANGO_SDIST_DIR [--backends sqlite,postgres]
[--apps basic,bulk_create,...]`` (``make django-upstream`` downloads the sdist
of the installed Django and calls this). For each backend the same apps run
twice, with ``autoseq_django`` installed both times; the tests that fail only
with our key are printed, and the exit status is 1 when there is any (or when a
run did not finish).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = "autoseq_django.fields.SequenceAutoField"
THEIRS = "django.db.models.BigAutoField"
APPS = (
    "basic",
    "bulk_create",
    "model_forms",
    "admin_views",
    "fixtures",
    "fixtures_regress",
    "serializers",
    "model_inheritance",
    "delete",
    "migrations",
)
#: Tests that fail only with our key by design, by backend, with the reason.
EXPECTED = {
    (
        "sqlite",
        "bulk_create.tests.BulkCreateTests.test_explicit_batch_size_respects_max_batch_size",
    ): (
        "every row carries its key, one more column than an AutoField INSERT, so SQLite's "
        "999-variable limit gives batches of 249 rows where the test counts on 333"
    ),
}
#: Tests that time themselves: under load they fail with either key, so they are not compared.
TIMED = {
    "serializers.test_deserialization.TestDeserializer.test_crafted_xml_performance",
}
_ALWAYS = "ALWAYS_INSTALLED_APPS = [\n"
_FAILED = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): (\S+) \(([^)]*)\)", re.M)
_RAN = re.compile(r"^Ran (\d+) tests? in", re.M)


@dataclass
class Run:
    """One ``runtests.py`` run: its failing tests (by id) and how many tests ran."""

    failed: set[str] = field(default_factory=set)
    ran: int | None = None
    seconds: float = 0.0


def runner(tests: Path) -> Path:
    """A copy of ``runtests.py`` that installs ``autoseq_django`` beside Django's contrib apps."""
    source = (tests / "runtests.py").read_text()
    if source.count(_ALWAYS) != 1:
        sys.exit(f"{tests / 'runtests.py'}: no single {_ALWAYS.strip()!r} line to extend")
    patched = tests / "runtests_autoseq.py"
    patched.write_text(source.replace(_ALWAYS, _ALWAYS + '    "autoseq_django",\n'))
    return patched


def run(script: Path, backend: str, auto_field: str, apps: list[str], log: Path) -> Run:
    """Run ``apps`` once; the output goes to ``log``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".ci")]),
        "AUTOSEQ_UPSTREAM_FIELD": auto_field,
        "AUTOSEQ_UPSTREAM_BACKEND": backend,
        "AUTOSEQ_UPSTREAM_RUN": uuid.uuid4().hex[:8],
    }
    command = [
        sys.executable,
        "-W",
        "ignore",
        str(script),
        "--settings=django_upstream_settings",
        "--parallel=1",
        "--noinput",
        *apps,
    ]
    started = time.monotonic()
    with log.open("w") as out:
        subprocess.run(command, cwd=script.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text(errors="replace")
    ran = _RAN.search(text)
    failed = {m.group(3) for m in _FAILED.finditer(text)}
    return Run(failed, int(ran.group(1)) if ran else None, time.monotonic() - started)


def app_of(test: str) -> str:
    """The test app a failing test id belongs to (its module's first part)."""
    return test.split(".", 1)[0]


def report(backend: str, apps: list[str], ours: Run, theirs: Run) -> list[str]:
    """Print the per-app counts of one backend; the tests failing only with our key."""
    expected = {test for where, test in EXPECTED if where == backend}
    only = sorted(ours.failed - theirs.failed - expected - TIMED)
    print(
        f"\n== {backend}: {ours.ran} tests with {OURS} ({ours.seconds:.0f} s), "
        f"{theirs.ran} with BigAutoField ({theirs.seconds:.0f} s)"
    )
    print(f"{'app':<20} {'autoseq':>8} {'BigAuto':>8} {'only autoseq':>13}")
    for app in apps:
        counts = [
            sum(app_of(t) == app for t in tests) for tests in (ours.failed, theirs.failed, only)
        ]
        print(f"{app:<20} {counts[0]:>8} {counts[1]:>8} {counts[2]:>13}")
    for test in only:
        print(f"  only with autoseq: {test}")
    for test in sorted(TIMED & (ours.failed | theirs.failed)):
        print(f"  not compared (times itself): {test}")
    for (where, test), reason in EXPECTED.items():
        if where == backend and test in ours.failed - theirs.failed:
            print(f"  expected: {test}: {reason}")
    return only


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="the unpacked Django sdist")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--logs", type=Path, default=None, help="where the run logs go")
    args = parser.parse_args()
    sdist = args.sdist.resolve()  # the runs change directory: a relative path would not hold
    tests = sdist / "tests"
    script = runner(tests)
    apps = [a for a in args.apps.split(",") if a]
    logs = (args.logs or sdist / "autoseq-logs").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    broken = False
    only_ours = 0
    for backend in [b for b in args.backends.split(",") if b]:
        ours = run(script, backend, OURS, apps, logs / f"{backend}-autoseq.log")
        theirs = run(script, backend, THEIRS, apps, logs / f"{backend}-bigautofield.log")
        only_ours += len(report(backend, apps, ours, theirs))
        for name, result in (("autoseq", ours), ("bigautofield", theirs)):
            if result.ran is None:
                broken = True
                print(f"  the {name} run did not finish: see {logs}/{backend}-{name}.log")
    print(f"\n{only_ours} test(s) fail only with {OURS}; logs in {logs}")
    return 1 if only_ours or broken else 0


if __name__ == "__main__":
    sys.exit(main())
