"""mongoengine insert throughput: autoseq_mongoengine's ``SequenceField`` vs the builtin.

On the MongoDB wire-protocol server (secantusdb, started by the run, or
``AUTOSEQ_MONGO_URL``): ``Document.objects.insert([...])`` in chunks of 1,000
and ``save()`` one by one, against mongoengine's own ``SequenceField`` (one
``findAndModify`` per document) and a plain ``ObjectId`` key (no counter at
all). Every command on a counter collection is counted with pymongo's command
monitoring; issue 4's targets: >= 2x the builtin's inserts/s, and at most
ceil(N / block) + 1 counter round trips against its N.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from benchmarks.harness import Contender, Group, Sample, Unavailable, run_group, stopwatch
from benchmarks.servers import Context, unique_name

CHUNK = 1000
AUTOSEQ = "autoseq_mongoengine SequenceField"
BUILTIN = "mongoengine builtin SequenceField"
OBJECTID = "ObjectId key (no counter)"


class Setup:
    def __init__(self, ctx: Context) -> None:
        try:
            import mongoengine
            from pymongo import monitoring
        except ImportError as exc:
            raise Unavailable(f"mongoengine is not installed: {exc}") from exc
        try:
            import autoseq_mongoengine
        except ImportError as exc:
            raise Unavailable(f"autoseq_mongoengine cannot be imported: {exc}") from exc
        url = ctx.mongo_url()
        self.alias = unique_name("alias")
        self.database = unique_name("db")
        self.counter_calls = 0
        sys_collection, counters_collection = unique_name("sys"), unique_name("counters")
        self.counter_collections = {sys_collection, counters_collection}
        outer = self

        class Listener(monitoring.CommandListener):
            def started(self, event: monitoring.CommandStartedEvent) -> None:
                # Every command on a counter collection: reads, CAS writes, upserts.
                target = event.command.get(event.command_name)
                if isinstance(target, str) and target in outer.counter_collections:
                    outer.counter_calls += 1

            def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
                pass

            def failed(self, event: monitoring.CommandFailedEvent) -> None:
                pass

        mongoengine.connect(
            db=self.database, host=url, alias=self.alias, event_listeners=[Listener()]
        )
        me = mongoengine

        def document(name: str, key: Any) -> Any:
            attrs: dict[str, Any] = {
                "meta": {"collection": unique_name(name), "db_alias": self.alias},
                "name": me.StringField(),
                "amount": me.IntField(),
            }
            if key is not None:
                attrs["id"] = key
            return type(f"Bench{name.title()}", (me.Document,), attrs)

        self.models = {
            AUTOSEQ: document(
                "autoseq",
                autoseq_mongoengine.SequenceField(
                    primary_key=True,
                    db_alias=self.alias,
                    collection_name=sys_collection,
                    sequence_name=unique_name("s"),
                ),
            ),
            BUILTIN: document(
                "builtin",
                me.SequenceField(
                    primary_key=True,
                    db_alias=self.alias,
                    collection_name=counters_collection,
                    sequence_name=unique_name("s"),
                ),
            ),
            OBJECTID: document("objectid", None),
        }
        self.mongoengine = mongoengine

    def trial(self, model: Any, n: int, bulk: bool) -> Sample:
        model.drop_collection()
        before = self.counter_calls
        with stopwatch() as elapsed:
            if bulk:
                for start in range(0, n, CHUNK):
                    model.objects.insert(
                        [
                            model(name=f"doc {i}", amount=i)
                            for i in range(start, min(n, start + CHUNK))
                        ]
                    )
            else:
                for i in range(n):
                    model(name=f"doc {i}", amount=i).save()
        calls = self.counter_calls - before
        count = model.objects.count()
        keys = len(model.objects.distinct("id"))
        if count != n or keys != n:
            raise AssertionError(f"{model.__name__}: {count} documents, {keys} keys, expected {n}")
        return Sample(n, elapsed[0], {"counter round trips": calls})

    def close(self) -> None:
        from mongoengine.connection import get_connection

        with contextlib.suppress(Exception):
            get_connection(self.alias).drop_database(self.database)
        self.mongoengine.disconnect(self.alias)


def run(ctx: Context) -> list[Group]:
    bulk_n, save_n = ctx.n(10_000, 1_000), ctx.n(1_000, 200)
    bulk = Group("orm", "mongoengine insert([...]), secantusdb", "docs/s", subject=AUTOSEQ)
    save = Group("orm", "mongoengine save() per document, secantusdb", "docs/s", subject=AUTOSEQ)
    try:
        setup = Setup(ctx)
    except Unavailable as exc:
        bulk.unavailable = save.unavailable = str(exc)
        return [bulk, save]
    try:
        for group, n, is_bulk in ((bulk, bulk_n, True), (save, save_n, False)):
            run_group(
                group,
                [
                    Contender(name, lambda m=model, n=n, b=is_bulk: setup.trial(m, n, b))
                    for name, model in setup.models.items()
                ],
                ctx.n(3, 2),
                warmup=False,
                log=ctx.log,
            )
            group.notes.append(
                f"{n:,} documents per trial" + (f" in chunks of {CHUNK:,}" if is_bulk else "")
            )
    finally:
        setup.close()
    mine, builtin = bulk.get(AUTOSEQ), bulk.get(BUILTIN)
    ratio = bulk.ratio(BUILTIN)
    if mine and mine.samples and builtin and builtin.samples and ratio:
        trips = max(mine.values("counter round trips"))
        bound = math.ceil(bulk_n / 100) + 1
        ctx.check(
            "issue 4: insert() of N documents >= 2x builtin, <= ceil(N/block)+1 round trips",
            ratio[0] >= 2 and trips <= bound,
            f"{ratio[0]:.1f}x the builtin's docs/s; {trips:.0f} counter round trips for "
            f"{bulk_n:,} documents (bound {bound}, builtin: "
            f"{builtin.median('counter round trips'):,.0f})",
        )
    saved, over_builtin = save.ratio(OBJECTID), save.ratio(BUILTIN)
    if saved:
        # A new document whose key autoseq took is inserted (force_insert),
        # not replaced-then-inserted as a document with a key would be.
        ctx.check(
            "issue 13: save() of a new document >= 0.9x an ObjectId document's docs/s",
            saved[0] >= 0.9,
            f"{saved[0]:.2f}x the ObjectId document's docs/s (range {saved[1]:.2f}.."
            f"{saved[2]:.2f}); {over_builtin[0] if over_builtin else float('nan'):.2f}x "
            "the builtin SequenceField's",
        )
    return [bulk, save]
