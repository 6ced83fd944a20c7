"""Each extra installed alone into a fresh virtual environment runs the README's quick start.

The development install pulls every extra, so a dependency that one extra
forgets (greenlet under SQLAlchemy 2.1) never shows in ``make test``. Here
each case gets its own venv with only ``pip install "<checkout>[extra]"``
(plus the pins it names), and runs the README's code block verbatim in an
empty directory. Exit status 1 names every case that failed.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile
import venv

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (case, extra, pins installed beside it, README heading whose first python block runs)
CASES = [
    ("sqlalchemy-2.1", "sqlalchemy", ["sqlalchemy>=2.1"], "## SQLAlchemy quick start"),
    ("sqlalchemy-2.0", "sqlalchemy", ["sqlalchemy<2.1"], "## SQLAlchemy quick start"),
]


def readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in README.md."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


def run_case(extra: str, pins: list[str], heading: str) -> str | None:
    """None when the quick start ran; else what went wrong."""
    with tempfile.TemporaryDirectory(prefix="autoseq-clean-") as tmp:
        env_dir = pathlib.Path(tmp) / "venv"
        venv.create(env_dir, with_pip=True)
        python = str(env_dir / "bin" / "python")
        install = [python, "-m", "pip", "install", "-q", f"{ROOT}[{extra}]", *pins]
        done = subprocess.run(install, capture_output=True, text=True, check=False)
        if done.returncode:
            return f"pip install failed: {done.stderr.strip()[-2000:]}"
        script = pathlib.Path(tmp) / "quickstart.py"
        script.write_text(readme_block(heading))
        work = pathlib.Path(tmp) / "work"
        work.mkdir()
        ran = subprocess.run(
            [python, str(script)], cwd=work, capture_output=True, text=True, check=False
        )
        if ran.returncode:
            return f"quick start failed: {ran.stderr.strip()[-2000:]}"
    return None


def main() -> int:
    failed = []
    for case, extra, pins, heading in CASES:
        problem = run_case(extra, pins, heading)
        print(f"clean install {case}: {'ok' if problem is None else 'FAILED'}", flush=True)
        if problem is not None:
            print(problem, file=sys.stderr)
            failed.append(case)
    print(f"clean installs: {len(CASES) - len(failed)} of {len(CASES)} cases ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
