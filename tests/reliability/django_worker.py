"""A Django process for the reliability suite: rows saved inside atomic(), often rolled back.

Run as ``python django_worker.py '<json job>'`` with ``database`` (Django
DATABASES entry), ``table``, ``out`` (value file), ``stop`` (a file whose
existence ends the loop). Each round opens ``transaction.atomic()``, saves
rows one by one and in a ``bulk_create``, writes every key handed out to
``out`` (one unbuffered write each), announces ``in-atomic`` so the parent
can SIGKILL it there, and then commits or rolls back at random.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import django
from django.conf import settings


class Rollback(Exception):
    """Raised inside atomic() to roll it back."""


def main(job: dict[str, Any]) -> int:
    settings.configure(
        DATABASES={"default": job["database"]},
        INSTALLED_APPS=["autoseq_django"],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        AUTOSEQ={"BUFFER": {"prefetch_at": 0.5}},
    )
    if job["database"]["ENGINE"].endswith("mysql"):
        import pymysql

        pymysql.install_as_MySQLdb()
    django.setup()
    from django.db import connection, models, transaction

    from autoseq_django.fields import SequenceField

    class Ticket(models.Model):
        id = SequenceField(primary_key=True, batch_count=7)
        note = models.CharField(max_length=20, default="")

        class Meta:
            app_label = "autoseq_django"
            db_table = job["table"]

    if job.get("create"):
        with connection.schema_editor() as editor:
            editor.create_model(Ticket)
        return 0
    fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while not os.path.exists(job["stop"]):
        try:
            with transaction.atomic():
                for _ in range(random.randint(1, 9)):
                    os.write(fd, b"%d\n" % Ticket.objects.create(note="one").pk)
                bulk = Ticket.objects.bulk_create([Ticket(note="bulk") for _ in range(12)])
                os.write(fd, b"".join(b"%d\n" % t.pk for t in bulk))
                os.write(1, b"in-atomic\n")
                time.sleep(0.02)
                if random.random() < 0.5:
                    raise Rollback
        except Rollback:
            pass
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
