"""Settings for Django's own test suite (``tests/runtests.py`` of its sdist) with autoseq.

Read by ``.ci/django_upstream.py``, which sets, for each run:

* ``AUTOSEQ_UPSTREAM_FIELD``: the ``DEFAULT_AUTO_FIELD`` (ours or ``BigAutoField``);
* ``AUTOSEQ_UPSTREAM_BACKEND``: ``sqlite`` (in memory, as Django's own
  ``test_sqlite.py``) or ``postgres`` (``AUTOSEQ_POSTGRES_URL``);
* ``AUTOSEQ_UPSTREAM_RUN``: a per-run suffix of the PostgreSQL database names.

``runtests.py`` replaces ``INSTALLED_APPS``; the runner adds ``autoseq_django``
to its always-installed apps instead.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

DEFAULT_AUTO_FIELD = os.environ.get(
    "AUTOSEQ_UPSTREAM_FIELD", "autoseq_django.fields.SequenceAutoField"
)
SECRET_KEY = "django_tests_secret_key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
USE_TZ = False

_BACKEND = os.environ.get("AUTOSEQ_UPSTREAM_BACKEND", "sqlite")
_RUN = os.environ.get("AUTOSEQ_UPSTREAM_RUN", "local")

if _BACKEND == "postgres":
    _url = make_url(
        os.environ.get("AUTOSEQ_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    )

    def _postgres(alias: str) -> dict[str, object]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": _url.host or "",
            "PORT": str(_url.port or ""),
            "USER": _url.username or "",
            "PASSWORD": _url.password or "",
            "NAME": _url.database,
            "TEST": {"NAME": f"test_autoseq_up_{_RUN}_{alias}"},
        }

    DATABASES = {"default": _postgres("default"), "other": _postgres("other")}
else:
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3"},
        "other": {"ENGINE": "django.db.backends.sqlite3"},
    }
