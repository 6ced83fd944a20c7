"""Django settings of the autoseq_django tests: one alias per reachable SQL backend.

``default`` is SQLite whose test database is in memory (what most projects'
tests use); ``sqlite`` is a SQLite file (its sequences in the companion
file), ``postgres`` and ``mysql`` are there when their servers answer. Test
databases get a per-run name, so runs sharing a server never collide.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid

from backends import MYSQL_URL, POSTGRES_URL, _sql_problem
from sqlalchemy.engine import make_url

RUN = uuid.uuid4().hex[:10]
TMP = tempfile.mkdtemp(prefix="autoseq-django-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)

SECRET_KEY = "autoseq-django-tests"
USE_TZ = True
DEBUG = False
ROOT_URLCONF = "django_tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "autoseq_django",
    "django_tests.testapp",
    "django_tests.legacy",
    "django_tests.switch",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASE_ROUTERS = ["autoseq_django.routers.SequenceRouter"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _server(url: str) -> dict[str, object]:
    parsed = make_url(url)
    return {
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "NAME": parsed.database,
        "TEST": {"NAME": f"test_autoseq_dj_{RUN}", "DEPENDENCIES": []},
    }


DATABASES: dict[str, dict[str, object]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(TMP, "default.sqlite3"),
    },
    "sqlite": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(TMP, "file.sqlite3"),
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        "TEST": {
            "NAME": os.path.join(TMP, "test_file.sqlite3"),
            "DEPENDENCIES": ["sqlite_seq"],
        },
    },
    # The companion file holding the sequences of "sqlite", opened by Django
    # for the admin tests (set up first: creating it deletes any old file).
    "sqlite_seq": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(TMP, "file.sqlite3.autoseq"),
        "TEST": {"NAME": os.path.join(TMP, "test_file.sqlite3.autoseq"), "DEPENDENCIES": []},
    },
}
#: Why a backend is missing, by backend name (tests skip or fail with it).
MISSING: dict[str, str] = {}

_problem = _sql_problem(POSTGRES_URL)
if _problem:
    MISSING["postgres"] = _problem
else:
    DATABASES["postgres"] = {"ENGINE": "django.db.backends.postgresql", **_server(POSTGRES_URL)}

_problem = _sql_problem(MYSQL_URL)
if _problem:
    MISSING["mysql"] = _problem
else:
    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL, for the tests
    DATABASES["mysql"] = {
        "ENGINE": "django.db.backends.mysql",
        **_server(MYSQL_URL),
        "OPTIONS": {"charset": "utf8mb4"},
    }
