"""Django insert throughput: autoseq_django's ``SequenceField`` vs ``BigAutoField``.

Two paths: ``bulk_create`` in chunks of 10,000 and ``save()`` one row at a
time, on SQLite, PostgreSQL and MariaDB (private databases of the run, see
``benchmarks.django_setup``). The contenders' trials run in turn a chunk (or
500 saves) at a time (``run_stepped``). Tables are emptied before each trial
(untimed), rows and distinct keys are counted after each. Issue 3's target:
``bulk_create`` of 100,000 rows >= 0.95x ``BigAutoField``, with about one
reservation per block.

A third contender, ``BigAutoField`` with keys the caller sets, is the
floor for any generator whose keys Django sends as a column (autoseq,
django-sequences, a snowflake): the same model and rows, with the key
values free (``save(force_insert=True)`` for ``save()``, as a key set on a
``BigAutoField`` model would otherwise cost an UPDATE probe first). What
separates it from plain ``BigAutoField`` is Django's cost of one more
column per row, not the generator's. Issue 16's target: ``bulk_create`` and
``save()`` >= 0.97x of it on every backend.
"""

from __future__ import annotations

import functools
from typing import Any

from benchmarks import django_setup
from benchmarks.harness import Group, Stepped, Steps, Unavailable, run_stepped
from benchmarks.servers import BACKEND_LABELS, Context

CHUNK = 10_000
SAVE_STEP = 500  # save() trials are interleaved this many rows at a time
AUTOSEQ = "autoseq_django SequenceField"
NATIVE = "BigAutoField"
EXPLICIT = "BigAutoField, keys set by the caller"


class Setup:
    def __init__(self, ctx: Context, backend: str) -> None:
        if not django_setup.has_autoseq_django():
            raise Unavailable("autoseq_django is not importable yet")
        self.using = django_setup.alias(ctx, backend)
        from django.apps import apps

        if not apps.is_installed("autoseq_django"):
            raise Unavailable("autoseq_django appeared after Django was set up in this run")
        from django.db import models

        from autoseq_django.fields import SequenceField

        def payload() -> dict[str, Any]:
            return {"name": models.CharField(max_length=50), "amount": models.IntegerField()}

        self.models = {
            AUTOSEQ: django_setup.make_model(
                "dj_autoseq", {"id": SequenceField(primary_key=True), **payload()}
            ),
            NATIVE: django_setup.make_model(
                "dj_native", {"id": models.BigAutoField(primary_key=True), **payload()}
            ),
            # The same model on a table of its own: the trials run side by side.
            EXPLICIT: django_setup.make_model(
                "dj_explicit", {"id": models.BigAutoField(primary_key=True), **payload()}
            ),
        }
        for model in self.models.values():
            django_setup.create_table(model, self.using)

    def reservations(self) -> int:
        try:
            from autoseq_django import registry as sequences

            return int(sequences.store(sequences.sequence_database(self.using)).reservations)
        except Exception:
            return 0  # not created yet: nothing reserved

    def start(self, model: Any, n: int, bulk: bool, explicit: bool = False) -> Steps:
        """Empty ``model``'s table (untimed) and cut a trial of ``n`` rows into steps."""
        manager = model.objects.using(self.using)
        django_setup.empty_table(model, self.using)
        before = self.reservations()

        def part(start: int, stop: int) -> None:
            rows = range(start, stop)
            if bulk and explicit:
                manager.bulk_create([model(id=i + 1, name=f"r{i}", amount=i) for i in rows])
            elif bulk:
                manager.bulk_create([model(name=f"r{i}", amount=i) for i in rows])
            elif explicit:
                # force_insert: a key set on a BigAutoField model would
                # otherwise cost an UPDATE probe before each INSERT.
                for i in rows:
                    model(id=i + 1, name=f"r{i}", amount=i).save(
                        using=self.using, force_insert=True
                    )
            else:
                for i in rows:
                    model(name=f"r{i}", amount=i).save(using=self.using)

        def finish() -> dict[str, float]:
            reservations = self.reservations() - before
            rows = manager.count()
            keys = manager.values("id").distinct().count()
            if rows != n or keys != n:
                raise AssertionError(f"{model.__name__}: {rows} rows, {keys} keys, expected {n}")
            return {"reservations": reservations}

        return Steps.chunks(n, CHUNK if bulk else SAVE_STEP, part, finish)

    def close(self) -> None:
        for model in self.models.values():
            django_setup.drop_table(model, self.using)


def run(ctx: Context) -> list[Group]:
    bulk_n, save_n = ctx.n(100_000, 5_000), ctx.n(5_000, 300)
    groups: list[Group] = []
    for backend in ("sqlite", "postgres", "mysql"):
        label = BACKEND_LABELS[backend]
        bulk = Group("orm", f"Django bulk_create, {label}", "rows/s", subject=AUTOSEQ)
        save = Group("orm", f"Django save() per row, {label}", "rows/s", subject=AUTOSEQ)
        groups += [bulk, save]
        try:
            setup = Setup(ctx, backend)
        except Unavailable as exc:
            bulk.unavailable = save.unavailable = str(exc)
            continue
        try:
            for group, n, is_bulk in ((bulk, bulk_n, True), (save, save_n, False)):
                contenders = [
                    Stepped(
                        name,
                        functools.partial(setup.start, model, n, is_bulk, name == EXPLICIT),
                        note="save(force_insert=True)" if name == EXPLICIT and not is_bulk else "",
                    )
                    for name, model in setup.models.items()
                ]
                run_stepped(group, contenders, ctx.insert_repeats, log=ctx.log)
                group.notes.append(
                    f"{n:,} rows per trial"
                    + (f" in chunks of {CHUNK:,}" if is_bulk else "")
                    + f", interleaved {'a chunk' if is_bulk else f'{SAVE_STEP:,} rows'} at a time"
                )
        finally:
            setup.close()
        for group in (bulk, save):
            ctx.floor_check(group, EXPLICIT, NATIVE)
        ratio, keyed = bulk.ratio(NATIVE), bulk.ratio(EXPLICIT)
        if ratio and backend in ("sqlite", "postgres"):
            floor = (
                f"; BigAutoField with keys set by the caller: {ratio[0] / keyed[0]:.2f}x"
                if keyed
                else ""
            )
            mine = bulk.get(AUTOSEQ)
            assert mine is not None
            ctx.check(
                f"issue 3: bulk_create of {bulk_n:,} rows >= 0.95x BigAutoField ({label})",
                ratio[0] >= 0.95,
                f"{ratio[0]:.2f}x (repeats {ratio[1]:.2f}..{ratio[2]:.2f}); "
                f"{mine.median('reservations') or 0:.0f} reservations per trial{floor}",
            )
    return groups
