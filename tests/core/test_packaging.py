"""Packaging: the version is written once; the contract suite ships without pytest at import."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys
import tomllib

import autoseq

ROOT = pathlib.Path(__file__).resolve().parents[2]


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


WITHOUT_GREENLET = """
import sys


class HideGreenlet:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "greenlet":
            raise ImportError("greenlet is not installed")


sys.meta_path.insert(0, HideGreenlet())
from sqlalchemy import create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session
from autoseq.sqlalchemy import SequenceField, install


class Base(DeclarativeBase): ...


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = SequenceField(primary_key=True)


install(Session)
engine = create_engine("sqlite:///" + sys.argv[1])
Base.metadata.create_all(engine)
with Session(engine) as session:
    session.add_all([Order() for _ in range(10)])
    session.commit()
    print(session.scalars(select(Order.id)).all())
"""


def test_sqlalchemy_quick_start_runs_without_greenlet(tmp_path: pathlib.Path) -> None:
    """The sync quick start flushes where greenlet is absent (SQLAlchemy 2.1 no longer pulls it)."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_GREENLET, str(tmp_path / "app.db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(list(range(1, 11)))
