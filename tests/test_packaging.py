"""Packaging: the version is written once; the contract suite ships without pytest at import."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import autoseq

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_version_is_written_once_in_the_package() -> None:
    """pyproject takes the version from autoseq.__version__; installed metadata agrees."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "autoseq.__version__"}
    assert importlib.metadata.version("autoseq") == autoseq.__version__


def test_importing_autoseq_and_its_testing_helpers_does_not_import_pytest() -> None:
    """import autoseq, autoseq.testing: no pytest; the contract module is separate."""
    code = (
        "import sys, autoseq, autoseq.testing; "
        "from autoseq.testing import FlakyStore; "
        "print('pytest' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
