"""Settings of the example shop: SQLite, with the sequences' companion file as a database."""

from __future__ import annotations

import os
from pathlib import Path

import autoseq_django

BASE_DIR = Path(__file__).resolve().parent
DATA_DIR = Path(os.environ.get("AUTOSEQ_EXAMPLE_DIR", BASE_DIR))

SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "autoseq_django",
    "example_project.orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "example.db",
        # Several processes write at once: wait for the lock, take it up front.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    },
}
# SQLite allows one writer per file, so the sequences of example.db live in
# example.db.autoseq; this alias lets the admin show them.
DATABASES["autoseq"] = autoseq_django.sqlite_companion(DATABASES["default"])
DATABASE_ROUTERS = ["autoseq_django.routers.SequenceRouter"]
AUTOSEQ = {"DATABASE": "autoseq"}
