"""A small project switched from BigAutoField to SequenceAutoField (test_switch_project.py).

``SWITCH_AUTO_FIELD`` is its ``DEFAULT_AUTO_FIELD``; ``SWITCH_DATABASE`` its
``DATABASES["default"]`` as JSON.
"""

from __future__ import annotations

import json
import os

SECRET_KEY = "switch-project"
USE_TZ = True
DEFAULT_AUTO_FIELD = os.environ["SWITCH_AUTO_FIELD"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "autoseq_django",
    "shop",
]
DATABASES = {"default": json.loads(os.environ["SWITCH_DATABASE"])}
if DATABASES["default"]["ENGINE"].endswith("mysql"):
    import pymysql

    pymysql.install_as_MySQLdb()
