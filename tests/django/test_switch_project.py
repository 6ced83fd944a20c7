"""A project with applied migrations switches DEFAULT_AUTO_FIELD and loses nothing.

The project in ``switch_project/`` runs as a user would run it, one command
per process: ``makemigrations`` and ``migrate`` with ``BigAutoField``, rows
with many-to-many links and multi-table inheritance; then the setting
becomes ``SequenceAutoField``, ``makemigrations`` and ``migrate`` run once,
and new rows and links are written. Each backend gets a database of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import MYSQL_URL, POSTGRES_URL, SQL_BACKENDS, _sql_problem, unavailable
from sqlalchemy.engine import make_url

PROJECT = Path(__file__).parent / "switch_project"
ROOT = Path(__file__).resolve().parents[2]
BIG = "django.db.models.BigAutoField"
OURS = "autoseq_django.fields.SequenceAutoField"


def _server_database(url: str, name: str, engine: str) -> Iterator[dict[str, Any]]:
    """A fresh database ``name`` on ``url``'s server, as a Django ``DATABASES`` entry."""
    import sqlalchemy as sa

    problem = _sql_problem(url)
    if problem:
        unavailable("postgres" if "postgres" in url else "mysql", problem)
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name}"))
    parsed = make_url(url)
    try:
        yield {
            "ENGINE": engine,
            "NAME": name,
            "USER": parsed.username or "",
            "PASSWORD": parsed.password or "",
            "HOST": parsed.host or "",
            "PORT": str(parsed.port or ""),
        }
    finally:
        force = " WITH (FORCE)" if "postgres" in url else ""
        with admin.connect() as connection:
            connection.execute(sa.text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()


@pytest.fixture(
    params=[
        pytest.param(name, marks=[getattr(pytest.mark, name)] if name != "sqlite" else [], id=name)
        for name in SQL_BACKENDS
    ]
)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The switch project's database on each SQL backend."""
    name = f"autoseq_switch_{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        yield {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db.sqlite3")}
    elif request.param == "postgres":
        yield from _server_database(POSTGRES_URL, name, "django.db.backends.postgresql")
    else:
        yield from _server_database(MYSQL_URL, name, "django.db.backends.mysql")


class Project:
    """The switch project copied to a directory, run one command per process."""

    def __init__(self, where: Path, database: dict[str, Any]) -> None:
        self.where = where
        shutil.copytree(PROJECT, where)
        self.database = database

    def run(self, auto_field: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``python *args`` in the project with ``auto_field`` as DEFAULT_AUTO_FIELD."""
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "settings",
            "PYTHONPATH": os.pathsep.join([str(self.where), str(ROOT)]),
            "SWITCH_AUTO_FIELD": auto_field,
            "SWITCH_DATABASE": json.dumps(self.database),
        }
        return subprocess.run(
            [sys.executable, *args],
            cwd=self.where,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    def ok(self, auto_field: str, *args: str) -> str:
        """Like :meth:`run`, failing the test with the output when the command fails."""
        done = self.run(auto_field, *args)
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def test_switching_default_auto_field_keeps_every_row_and_link(
    database: dict[str, Any], tmp_path: Path
) -> None:
    """BigAutoField rows, then the switch: one makemigrations + migrate, every new row saved."""
    project = Project(tmp_path / "project", database)
    project.ok(BIG, "manage.py", "makemigrations", "shop")
    project.ok(BIG, "manage.py", "migrate")
    before = json.loads(project.ok(BIG, "steps.py", "before"))
    assert before == {
        "tags": 3, "posts": 3, "links": 9, "new_post_links": 0, "places": 3, "restaurants": 1
    }  # fmt: skip

    written = project.ok(OURS, "manage.py", "makemigrations", "shop")
    assert "Alter field id on" in written
    project.ok(OURS, "manage.py", "migrate")  # django_migrations takes sequence keys now
    after = json.loads(project.ok(OURS, "steps.py", "after"))
    assert after == {
        "tags": 3 + 4 + 5,
        "posts": 4,
        "links": 9 + 7,
        "new_post_links": 7,
        "places": 3 + 1,  # the restaurant for an existing place adds no place
        "restaurants": 3,
    }
    doctor = project.run(OURS, "manage.py", "autoseq", "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    for table in ("django_migrations", "shop_post_tags", "shop_tag", "shop_place"):
        assert table in doctor.stdout


def test_doctor_and_sync_cover_django_and_link_tables(
    database: dict[str, Any], tmp_path: Path
) -> None:
    """Keys written behind the ORM's back in django_migrations and a link table: doctor, sync."""
    project = Project(tmp_path / "project", database)
    project.ok(OURS, "manage.py", "makemigrations", "shop")
    project.ok(OURS, "manage.py", "migrate")
    project.ok(OURS, "steps.py", "before")
    project.ok(OURS, "steps.py", "raw")
    doctor = project.run(OURS, "manage.py", "autoseq", "doctor", "django_migrations")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    doctor = project.run(OURS, "manage.py", "autoseq", "doctor", "shop_post_tags")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    synced = project.ok(OURS, "manage.py", "autoseq", "sync")
    assert "'django_migrations'" in synced
    assert "'shop_post_tags'" in synced
    project.ok(OURS, "manage.py", "autoseq", "doctor")
