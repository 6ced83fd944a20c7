"""The store contract, for pytest: a store proves itself by subclassing these classes.

A test module subclasses `StoreContract` (and
`MaintenanceContract`) and provides only the ``store`` fixture: a
fresh, empty store on its real server. Every behaviour below is then checked
against that store, as autoseq's own stores are (see ``docs/stores.md``)::

    from autoseq.testing.contract import StoreContract

    class TestMyStore(StoreContract):
        @pytest.fixture
        def store(self):
            store = MyStore(...)
            yield store
            store.close()

This module imports pytest; ``autoseq`` itself never imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from autoseq import (
    MAX_VALUE,
    InvalidSequenceConfig,
    SequenceConfig,
    SequenceExhausted,
    SequenceNotFound,
    SequenceRegistry,
    maintenance,
)
from autoseq.errors import InvalidCount, InvalidStoredRow, StoreUnavailable, ValueMovesBackward
from autoseq.lock import SequenceLock
from autoseq.pacing import DEFAULT_MAX_BATCH_COUNT
from autoseq.stores import Block, SequenceStore
from autoseq.stores.base import create_many, release_many, reserve_many
from autoseq.stores.capabilities import CreatesMany, LeasesWorkers
from autoseq.workers import WorkerLeases, worker_leases

HOSTILE_NAMES = [
    "orders'; DROP TABLE sys_sequence; --",
    '{"$gt": ""}',
    "$where",
    ".hidden.dots",
    'quote"double',
    "\u6d4b\u8bd5-\u5e8f\u5217",
    "x" * 191,
]


class StoreContract:
    """Behaviour every ``SequenceStore`` must have, checked on a real server.

    ``shared_between_processes``: set it False for a store whose rows live
    in one process's memory (``MemoryStore``); the fork test then skips.
    """

    shared_between_processes = True

    @pytest.fixture
    def store(self) -> Any:
        raise NotImplementedError("a store test module provides the store fixture")

    def test_is_a_sequence_store(self, store: Any) -> None:
        """The store satisfies the SequenceStore protocol."""
        assert isinstance(store, SequenceStore)

    def test_create_sets_current_to_start(self, store: Any) -> None:
        """A new row starts with current = start."""
        row = store.create(SequenceConfig("orders", start=1000, step=5))
        assert (row.name, row.start, row.step, row.current) == ("orders", 1000, 5, 1000)

    def test_create_keeps_existing_row(self, store: Any) -> None:
        """Creating a row that exists returns the stored one unchanged."""
        store.create(SequenceConfig("orders", start=7))
        store.reserve("orders", 3)
        row = store.create(SequenceConfig("orders", start=500, step=9))
        assert (row.start, row.step, row.current) == (7, 1, 10)

    def test_read_missing_is_none(self, store: Any) -> None:
        """Reading an unknown name gives None."""
        assert store.read("nothing-here") is None

    def test_read_all_lists_rows_by_name(self, store: Any) -> None:
        """read_all returns every row, sorted by name."""
        for name in ("b", "a", "c"):
            store.create(SequenceConfig(name))
        assert [row.name for row in store.read_all()] == ["a", "b", "c"]

    def test_reserve_hands_out_consecutive_blocks(self, store: Any) -> None:
        """Blocks follow each other without gap or overlap, step respected."""
        store.create(SequenceConfig("s", start=10, step=3))
        first = store.reserve("s", 4)
        second = store.reserve("s", 2)
        assert list(first.values()) == [10, 13, 16, 19]
        assert list(second.values()) == [22, 25]
        assert store.read("s").current == 28

    def test_reserve_unknown_raises_not_found(self, store: Any) -> None:
        """Reserving from a missing row raises SequenceNotFound naming it."""
        with pytest.raises(SequenceNotFound, match="ghost"):
            store.reserve("ghost", 10)

    def test_reserve_stops_at_end_then_raises_exhausted(self, store: Any) -> None:
        """The last block is cut at end; the next reservation raises SequenceExhausted."""
        store.create(SequenceConfig("short", start=1, end=10, step=2))
        block = store.reserve("short", 100)
        assert list(block.values()) == [1, 3, 5, 7, 9]
        with pytest.raises(SequenceExhausted) as caught:
            store.reserve("short", 1)
        assert (caught.value.name, caught.value.current, caught.value.end) == ("short", 11, 10)
        assert store.read("short").current == 11

    def test_cycle_wraps_to_start(self, store: Any) -> None:
        """A cycling sequence wraps from end back to start and says so."""
        store.create(SequenceConfig("ring", start=1, end=5, cycle=True))
        assert list(store.reserve("ring", 5).values()) == [1, 2, 3, 4, 5]
        block = store.reserve("ring", 2)
        assert block.cycled
        assert list(block.values()) == [1, 2]

    def test_end_near_int64_max(self, store: Any) -> None:
        """Values near 2**63 - 1 are stored exactly and exhaustion is clean."""
        start = MAX_VALUE - 10
        store.create(SequenceConfig("big", start=start))
        block = store.reserve("big", 100)
        assert block.first == start
        assert block.last == MAX_VALUE - 1
        with pytest.raises(SequenceExhausted):
            store.reserve("big", 1)

    def test_blocks_of_the_default_ceiling_are_exact(self, store: Any) -> None:
        """Blocks of DEFAULT_MAX_BATCH_COUNT values are exact past 2**53, cut at end, and cycle."""
        size = DEFAULT_MAX_BATCH_COUNT
        start = 2**53 - size // 2  # a double cannot hold every value of this block
        store.create(SequenceConfig("wide", start=start, step=7))
        first = store.reserve("wide", size)
        second = store.reserve("wide", size)
        assert (first.first, first.last) == (start, start + (size - 1) * 7)
        assert (second.first, second.last) == (first.last + 7, first.last + size * 7)
        assert store.read("wide").current == second.last + 7
        end = MAX_VALUE - 5
        store.create(SequenceConfig("edge", start=end - size, end=end, step=3, cycle=True))
        last = end - size + size // 3 * 3  # the last value on the grid, at or below end
        near = store.reserve("edge", size)
        assert (near.first, near.last) == (end - size, last)  # cut at end
        wrapped = store.reserve("edge", size)
        assert wrapped.cycled
        assert (wrapped.first, wrapped.last) == (end - size, last)

    def test_update_changes_settings(self, store: Any) -> None:
        """update overwrites a row's settings; reservations follow them."""
        row = store.create(SequenceConfig("u"))
        store.update(row.replace(current=501, step=1, end=1000))
        assert store.reserve("u", 2).first == 501
        assert store.read("u").end == 1000

    def test_update_missing_raises_not_found(self, store: Any) -> None:
        """Updating a row that does not exist raises SequenceNotFound."""
        with pytest.raises(SequenceNotFound):
            store.update(SequenceConfig("absent"))

    def test_release_returns_unused_tail(self, store: Any) -> None:
        """Releasing the latest block puts current back, so no gap is left."""
        store.create(SequenceConfig("r"))
        block = store.reserve("r", 50)
        tail = Block("r", block.first + 10, block.last, block.step, block.row)
        assert store.release(tail) is True
        assert store.read("r").current == 11

    def test_release_refuses_after_later_reservation(self, store: Any) -> None:
        """A block that someone reserved past is not handed back."""
        store.create(SequenceConfig("r2"))
        block = store.reserve("r2", 50)
        store.reserve("r2", 50)
        assert store.release(block) is False
        assert store.read("r2").current == 101

    def test_release_many_is_a_compare_and_set_per_block(self, store: Any) -> None:
        """release_many hands back the blocks nobody reserved past, and only those."""
        for name in ("m1", "m2", "m3"):
            store.create(SequenceConfig(name))
        blocks = [store.reserve(name, 50) for name in ("m1", "m2", "m3")]
        store.reserve("m2", 50)  # someone reserved past m2's block: it must stay a gap
        tail = Block("m3", 21, 50, 1, blocks[2].row)
        assert release_many(store, [blocks[0], blocks[1], tail]) == [True, False, True]
        assert [store.read(name).current for name in ("m1", "m2", "m3")] == [1, 101, 21]
        assert release_many(store, [blocks[0], tail]) == [False, False]  # re-sent: no rewind
        assert release_many(store, []) == []
        assert store.reserve("m1", 2).first == 1

    # many rows at once (issue 34) -----------------------------------------------

    def test_create_many_creates_what_is_missing_and_keeps_what_exists(self, store: Any) -> None:
        """create_many is create of each: the existing row wins, a repeated name gets the
        row of its first config, new rows start at start with version 0."""
        store.create(SequenceConfig("x", start=7))
        store.reserve("x", 3)
        configs = [
            SequenceConfig("a", start=5),
            SequenceConfig("x", start=500, step=9),
            SequenceConfig("b", step=3, batch_count=7),
            SequenceConfig("a", start=99),
        ]
        rows = create_many(store, configs)
        assert [(r.name, r.start, r.step, r.current, r.version) for r in rows] == [
            ("a", 5, 1, 5, 0),
            ("x", 7, 1, 10, 1),
            ("b", 1, 3, 1, 0),
            ("a", 5, 1, 5, 0),
        ]
        assert rows[2].batch_count == 7
        assert [row.name for row in store.read_all()] == ["a", "b", "x"]
        assert [store.read(name) for name in ("a", "b", "x")] == [rows[0], rows[2], rows[1]]
        assert create_many(store, []) == []
        assert store.reserve("a", 2).first == 5

    @pytest.mark.parametrize(
        "bad", [[SequenceConfig("ok1"), "orders"], [SequenceConfig("ok1"), None], "orders"]
    )
    def test_create_many_refuses_a_bad_item_before_any_write(self, store: Any, bad: Any) -> None:
        """An item that is not a SequenceConfig is InvalidSequenceConfig; nothing is created."""
        with pytest.raises(InvalidSequenceConfig, match="SequenceConfig"):
            create_many(store, bad)
        with pytest.raises(InvalidSequenceConfig, match="SequenceConfig"):
            store.create_many(bad) if isinstance(store, CreatesMany) else create_many(store, bad)
        assert store.read_all() == []

    def test_racing_create_many_agree_on_every_row(self, store: Any) -> None:
        """Threads creating overlapping rows at once all get the one stored row of each."""
        names = [f"c{i:03d}" for i in range(60)]
        results: list[dict[str, tuple[int, int]]] = []
        errors: list[BaseException] = []

        def create(offset: int) -> None:
            mine = names[offset:] + names[:offset]
            configs = [SequenceConfig(name, start=offset * 1000 + 1) for name in mine]
            try:
                rows = create_many(store, configs)
                results.append({row.name: (row.start, row.version) for row in rows})
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=create, args=(i * 15,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        stored = {row.name: (row.start, row.version) for row in store.read_all()}
        assert sorted(stored) == names
        assert results == [stored] * 4

    def test_reserve_many_is_each_rows_reservation_or_nothing(self, store: Any) -> None:
        """Each answer is the block reserve() would make (a compare-and-set on its row), or
        None with the row untouched; a missing or exhausted row is always None."""
        store.create(SequenceConfig("r1"))
        store.create(SequenceConfig("r2", start=10, step=5))
        store.create(SequenceConfig("done", end=5))
        store.reserve("done", 5)
        store.reserve("r2", 2)
        before = {name: store.read(name) for name in ("r1", "r2", "done")}
        asked = [("r1", 10), ("r2", 3), ("missing", 4), ("done", 1)]
        answers = reserve_many(store, asked)
        assert len(answers) == 4
        assert answers[2] is None
        assert answers[3] is None
        assert store.read("missing") is None
        for (name, count), block in zip(asked[:2], answers[:2], strict=True):
            row = store.read(name)
            if block is None:
                assert (row.current, row.version) == (before[name].current, before[name].version)
                continue
            assert (block.name, block.first, block.count) == (name, before[name].current, count)
            assert block.version == before[name].version + 1 == row.version
            assert row.current == block.last + block.step
        assert store.read("done").version == before["done"].version
        assert reserve_many(store, []) == []
        version = store.read("r1").version
        with pytest.raises(InvalidCount):  # checked before anything is written
            reserve_many(store, [("r1", 5), ("r2", 0)])
        assert store.read("r1").version == version

    def test_reserve_many_and_reserve_never_share_a_value(self, store: Any) -> None:
        """Threads reserving many rows at once and one row at a time: no value twice."""
        names = [f"t{i}" for i in range(5)]
        for name in names:
            store.create(SequenceConfig(name))
        seen: dict[str, list[int]] = {name: [] for name in names}
        errors: list[BaseException] = []
        guard = threading.Lock()

        def keep(block: Block) -> None:
            with guard:
                seen[block.name].extend(block.values())

        def many() -> None:
            try:
                for _ in range(15):
                    for block in reserve_many(store, [(name, 7) for name in names]):
                        if block is not None:
                            keep(block)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def one() -> None:
            try:
                for round_ in range(30):
                    keep(store.reserve(names[round_ % len(names)], 3))
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=many) for _ in range(3)]
        threads += [threading.Thread(target=one) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        for name, values in seen.items():
            assert len(values) == len(set(values)), f"{name}: a value handed out twice"
            assert store.read(name).current == max(values) + 1

    @pytest.mark.parametrize("count", [0, -1, 1.5, True, 2**63, "3", None])
    def test_bad_count_is_refused_before_any_write(self, store: Any, count: Any) -> None:
        """A count that is not an int from 1 to 2**63 - 1 is InvalidCount; the row is untouched."""
        store.create(SequenceConfig("z"))
        with pytest.raises(InvalidCount):
            store.reserve("z", count)
        row = store.read("z")
        assert (row.current, row.version) == (1, 0)
        assert store.reserve("z", 2).first == 1

    # versions and the compare-and-set ----------------------------------------

    def test_every_write_bumps_the_version(self, store: Any) -> None:
        """create starts at version 0; each reservation, update and hand-back adds one."""
        assert store.create(SequenceConfig("v")).version == 0
        first = store.reserve("v", 10)
        assert first.version == 1 == store.read("v").version
        second = store.reserve("v", 10)
        assert second.version == 2
        assert store.release(second) is True
        assert store.read("v").version == 3
        assert store.update(store.read("v").replace(batch_count=7)).version == 4

    def test_compare_and_set_applies_at_the_expected_version(self, store: Any) -> None:
        """A matching version writes every setting and returns the row at version + 1."""
        store.create(SequenceConfig("c"))
        block = store.reserve("c", 10)
        wanted = block.row.replace(current=1001, step=1, batch_count=5, end=10**6)
        written = store.compare_and_set(wanted, block.version)
        assert written is not None
        assert (written.current, written.batch_count, written.end) == (1001, 5, 10**6)
        assert written.version == block.version + 1 == store.read("c").version
        assert store.reserve("c", 1).first == 1001

    def test_compare_and_set_resent_changes_nothing(self, store: Any) -> None:
        """The same write sent again (its reply was lost) finds another version: no change."""
        store.create(SequenceConfig("re"))
        row = store.read("re")
        assert store.compare_and_set(row.replace(current=500), row.version) is not None
        store.reserve("re", 10)  # another process moves on: current 510
        assert store.compare_and_set(row.replace(current=500), row.version) is None
        assert store.read("re").current == 510
        assert store.reserve("re", 1).first == 510

    def test_compare_and_set_missing_row_raises_not_found(self, store: Any) -> None:
        """A compare-and-set of a row that does not exist raises SequenceNotFound."""
        with pytest.raises(SequenceNotFound):
            store.compare_and_set(SequenceConfig("nobody"), 0)

    def test_retried_release_never_rewinds_a_row_that_came_back(self, store: Any) -> None:
        """ABA: current returns to the same value, but a stale hand-back sees the new version."""
        store.create(SequenceConfig("aba", batch_count=10))
        handed: list[int] = []
        block = store.reserve("aba", 10)
        tail = Block("aba", block.first + 5, block.last, block.step, block.row)
        handed += range(block.first, block.first + 5)
        assert store.release(tail) is True  # current back to 6
        again = store.reserve("aba", 5)  # current is 11 again, as when tail was cut
        handed += again.values()
        assert store.release(tail) is False  # the re-sent hand-back
        handed += store.reserve("aba", 5).values()
        assert len(handed) == len(set(handed)) == 15

    def test_stale_release_after_a_cycle_is_refused(self, store: Any) -> None:
        """After the sequence wraps, a hand-back from the previous lap changes nothing."""
        store.create(SequenceConfig("lap", start=1, end=10, cycle=True))
        old = store.reserve("lap", 10)
        new = store.reserve("lap", 4)
        assert new.cycled
        store.reserve("lap", 6)  # current is back at 11, the old block's end
        assert store.release(old) is False
        assert store.reserve("lap", 1).first == 1  # wraps again, not a repeat in the lap

    @pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
    def test_hostile_names_round_trip_as_data(self, store: Any, name: str) -> None:
        """Names full of SQL or MongoDB operators are stored and matched as plain data."""
        store.create(SequenceConfig("bystander"))
        store.create(SequenceConfig(name, start=42))
        assert store.reserve(name, 2).first == 42
        assert store.read(name).name == name
        assert store.read("bystander").current == 1
        assert {row.name for row in store.read_all()} == {"bystander", name}

    def test_names_differing_only_in_case_or_accents_are_different_sequences(
        self, store: Any
    ) -> None:
        """orders/Orders, cafe/café/CAFÉ (composed or not) are separate rows, each its own start."""
        names = ["orders", "Orders", "ORDERS", "cafe", "caf\u00e9", "CAF\u00c9", "cafe\u0301"]
        for index, name in enumerate(names):
            created = store.create(SequenceConfig(name, start=100 * (index + 1)))
            assert (created.name, created.start) == (name, 100 * (index + 1))
        firsts = {name: store.reserve(name, 1).first for name in names}
        assert firsts == {name: 100 * (index + 1) for index, name in enumerate(names)}
        assert {name: store.read(name).name for name in names} == {name: name for name in names}
        assert sorted(row.name for row in store.read_all()) == sorted(names)

    def test_invalid_names_are_refused(self, store: Any) -> None:
        """Non-string or empty names get InvalidSequenceConfig before any I/O."""
        for bad in (None, 12, "", " padded ", "a\x00b", "y" * 192, "lone\ud800surrogate"):
            with pytest.raises(InvalidSequenceConfig):
                store.reserve(bad, 1)
        assert store.read_all() == []

    def test_threads_never_share_a_value(self, store: Any) -> None:
        """Eight threads reserving at once get disjoint blocks covering the range."""
        store.create(SequenceConfig("t"))
        seen: list[int] = []
        guard = threading.Lock()

        def work() -> None:
            for _ in range(15):
                values = list(store.reserve("t", 7).values())
                with guard:
                    seen.extend(values)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(seen) == len(set(seen)) == 8 * 15 * 7
        assert sorted(seen) == list(range(1, 8 * 15 * 7 + 1))

    def test_after_fork_keeps_the_rows_and_the_order(self, store: Any) -> None:
        """after_fork() (what a forked child calls) drops connections, never rows or order."""
        store.create(SequenceConfig("af"))
        assert store.reserve("af", 5).first == 1
        store.after_fork()
        assert store.reserve("af", 5).first == 6
        assert store.read("af").current == 11

    def test_a_forked_child_reserves_apart_from_its_parent(self, store: Any) -> None:
        """A child process (after_fork) and its parent reserve at once: no value twice."""
        if not self.shared_between_processes:
            pytest.skip(f"{type(store).__name__} keeps its rows in one process")
        if not hasattr(os, "fork"):
            pytest.skip("no os.fork on this platform")
        store.create(SequenceConfig("fork"))
        store.reserve("fork", 10)  # connections open before the fork, to be dropped
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                store.after_fork()
                blocks = [store.reserve("fork", 10) for _ in range(20)]
                os.write(writer, json.dumps([[b.first, b.last] for b in blocks]).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        parent = [store.reserve("fork", 10) for _ in range(20)]
        data = b""
        while chunk := os.read(reader, 65536):
            data += chunk
        os.close(reader)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child failed to reserve"
        values = [v for first, last in json.loads(data) for v in range(first, last + 1)]
        values += [v for block in parent for v in block.values()]
        assert len(values) == len(set(values)) == 400
        assert store.read("fork").current == 411

    def test_close_after_the_registry_is_safe_to_repeat(self, store: Any) -> None:
        """A registry closes first (its tail goes back), then store.close(); twice is harmless."""
        registry = SequenceRegistry(store, auto_create=True)
        assert registry.next("closing") == 1
        registry.close()
        assert store.read("closing").current == 2
        store.close()
        store.close()

    def test_registry_serves_through_store(self, store: Any) -> None:
        """A registry on this store serves ordered values and hands the tail back on close."""
        registry = SequenceRegistry(store, auto_create=True)
        values = [registry.next("orders") for _ in range(250)] + registry.next_many("orders", 1000)
        assert values == list(range(1, 1251))
        registry.close()
        assert store.read("orders").current == 1251

    # error translation ------------------------------------------------------

    @pytest.fixture
    def unavailable_store(self) -> Any:
        """The store on a server that does not answer (a closed port, say).

        A store test module overrides this to prove its driver errors become
        ``StoreUnavailable``; without it the two checks below skip.
        """
        pytest.skip("no unavailable_store fixture: error translation is not proven")

    def test_driver_errors_become_store_unavailable(self, unavailable_store: Any) -> None:
        """Every operation on an unreachable server raises ``StoreUnavailable``, never a
        driver's own error, and says which operation failed and why."""
        check_errors_translated(unavailable_store)

    def test_a_failing_store_is_backed_off(self, unavailable_store: Any) -> None:
        """Callers hammering a sequence whose store fails reach the store only a few
        times: the back-off works only on ``StoreUnavailable``."""
        check_backed_off(unavailable_store)

    # worker leases ----------------------------------------------------------

    def forget_worker_leases(self, leases: WorkerLeases) -> None:
        """Drop what the lease checks wrote (a SQL store's ``sys_worker`` table, say)."""

    @pytest.fixture
    def leases(self, store: Any) -> Any:
        if not isinstance(store, LeasesWorkers | WorkerLeases):
            pytest.skip(f"{type(store).__name__} does not lease snowflake worker ids")
        leases = worker_leases(store)
        yield leases
        self.forget_worker_leases(leases)

    def test_worker_leases_are_exclusive_until_released_or_expired(self, leases: Any) -> None:
        """Two owners get two workers; a full set gives None; a release or an expiry frees
        one, and the next owner starts past the last millisecond its holder used."""
        check_worker_leases(leases)

    def test_threads_never_lease_one_worker_twice(self, leases: Any) -> None:
        """Sixteen threads leasing eight workers at once: eight leases, all different."""
        check_leases_race(leases)

    def test_only_the_first_layout_is_recorded(self, leases: Any) -> None:
        """Of two layouts claimed for one name, the first stays."""
        now = _now_ms()
        first = leases.claim_layout("layout", "41/10/12", now, 0)
        second = leases.claim_layout("layout", "41/8/14", now, 0)
        assert first.owner == second.owner == "41/10/12"
        assert not leases.list_workers("layout")
        assert len(leases.list_workers("layout", layouts=True)) == 1


_OPERATIONS: list[tuple[str, Any]] = [
    ("read", lambda store: store.read("orders")),
    ("read_all", lambda store: store.read_all()),
    ("create", lambda store: store.create(SequenceConfig("orders"))),
    ("reserve", lambda store: store.reserve("orders", 10)),
    ("update", lambda store: store.update(SequenceConfig("orders", step=2))),
]


def check_errors_translated(store: Any) -> None:
    """Each operation on ``store`` (whose server does not answer) raises
    ``StoreUnavailable`` naming the cause; call it from a third-party suite too."""
    for what, call in _OPERATIONS:
        error: StoreUnavailable | None = None
        try:
            call(store)
        except StoreUnavailable as exc:
            error = exc
        except Exception as exc:
            raise AssertionError(
                f"{what} raised {type(exc).__module__}.{type(exc).__name__} ({exc}), not "
                "StoreUnavailable: wrap the driver's errors (autoseq.stores._errors.translating "
                "does it for autoseq's stores), or callers lose the back-off"
            ) from exc
        assert error is not None, f"{what} succeeded on a store whose server does not answer"
        assert str(error), f"{what}: StoreUnavailable without a message"


class _Counting:
    """Counts the reservations that reach ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reservations = 0

    def reserve(self, name: str, count: int) -> Block:
        self.reservations += 1
        block: Block = self.inner.reserve(name, count)
        return block

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


#: Reservations a failing store may see in ``BACKOFF_WINDOW`` seconds of calls:
#: the default back-off (0.05 s doubling) allows about four.
BACKOFF_WINDOW = 0.5
BACKOFF_LIMIT = 10


def check_backed_off(store: Any, window: float = BACKOFF_WINDOW) -> int:
    """Serve from ``store`` (failing) in a tight loop for ``window`` seconds; return how
    many reservations reached it, asserting at most ``BACKOFF_LIMIT``."""
    counting = _Counting(store)
    lock = SequenceLock("orders", counting)
    deadline = time.monotonic() + window
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                lock.next()
    finally:
        with contextlib.suppress(Exception):
            lock.close()
    assert counting.reservations <= BACKOFF_LIMIT, (
        f"{counting.reservations} reservations reached a failing store in {window} s "
        f"(at most {BACKOFF_LIMIT}): its errors are not StoreUnavailable, so they are not "
        "backed off"
    )
    return counting.reservations


def _now_ms() -> int:
    return int(time.time() * 1000)


def check_worker_leases(leases: Any) -> None:
    """The lease rules of `WorkerLeases` on one store."""
    now = _now_ms()
    first = leases.acquire_worker("ids", "a", 2, now, 60_000)
    second = leases.acquire_worker("ids", "b", 2, now, 60_000)
    assert first is not None
    assert second is not None
    assert {first.worker, second.worker} == {0, 1}
    assert leases.acquire_worker("ids", "c", 2, now, 60_000) is None
    renewed = leases.renew_worker(first, now + 10, 60_000, now + 5)
    assert renewed is not None
    assert renewed.expires_ms >= now + 60_010
    stolen = replace(second, owner="c")
    assert leases.renew_worker(stolen, now + 10, 60_000, now + 5) is None
    assert not leases.release_worker(stolen, now + 5)
    assert leases.release_worker(second, now + 777)
    third = leases.acquire_worker("ids", "c", 2, now + 20, 60_000)
    assert third is not None
    assert third.worker == second.worker
    assert third.floor_ms >= now + 777
    expired = leases.acquire_worker("ids", "d", 2, now + 200_000, 60_000)
    assert expired is not None
    assert expired.owner == "d"
    rows = leases.list_workers("ids")
    assert sorted(row.worker for row in rows) == [0, 1]


def check_leases_race(leases: Any, threads: int = 16, workers: int = 8) -> None:
    now = _now_ms()
    won: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def take(owner: str) -> None:
        start.wait()
        try:
            lease = leases.acquire_worker("race", owner, workers, now, 60_000)
        except BaseException as exc:  # noqa: BLE001  (reported after the join)
            errors.append(exc)
            return
        if lease is not None:
            won.append(lease.worker)

    running = [threading.Thread(target=take, args=(f"o{i}",)) for i in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    assert not errors, errors
    assert len(won) == len(set(won)) == workers


class MaintenanceContract:
    """``autoseq.maintenance`` on every store: each write a compare-and-set on the version.

    A subclass provides ``store`` and ``corrupt(store, name, **fields)``, which
    writes raw values into a stored row behind the store's back (a hand edit).
    """

    @pytest.fixture
    def store(self) -> Any:
        raise NotImplementedError("a store test module provides the store fixture")

    def corrupt(self, store: Any, name: str, **fields: Any) -> None:
        pytest.skip(f"{type(store).__name__} cannot hold a row that fails validation")

    def test_set_moves_forward_only_unless_forced(self, store: Any) -> None:
        """set_current refuses a value behind current; force moves it back."""
        store.create(SequenceConfig("s"))
        assert maintenance.set_current(store, "s", 500).current == 500
        with pytest.raises(ValueMovesBackward, match="only move forward"):
            maintenance.set_current(store, "s", 100)
        assert store.read("s").current == 500
        assert maintenance.set_current(store, "s", 100, force=True).current == 100

    def test_set_never_goes_to_or_below_the_floor(self, store: Any) -> None:
        """A floor (max() of the columns using it) is a hard limit, even forced."""
        store.create(SequenceConfig("f"))
        with pytest.raises(ValueMovesBackward, match="past 900"):
            maintenance.set_current(store, "f", 900, floor=900, force=True)
        assert maintenance.set_current(store, "f", 901, floor=900).current == 901

    def test_a_block_reserved_before_a_set_is_not_handed_back(self, store: Any) -> None:
        """A hand-back of a block reserved before a maintenance write changes nothing."""
        store.create(SequenceConfig("hb"))
        block = store.reserve("hb", 100)
        maintenance.set_current(store, "hb", 1000)
        assert store.release(block) is False
        assert store.reserve("hb", 1).first == 1000

    def test_step_change_moves_current_onto_the_new_grid(self, store: Any) -> None:
        """Changing step keeps the row valid: current goes to the next value of the new grid."""
        store.create(SequenceConfig("g", start=1))
        old = store.reserve("g", 10)  # 1..10 held by a process; current 11
        changed = maintenance.change(store, "g", step=7)
        assert (changed.step, changed.current) == (7, 15)
        assert store.release(old) is False  # that process's close() after the change
        block = store.reserve("g", 3)
        assert list(block.values()) == [15, 22, 29]

    def test_end_cannot_fall_below_what_was_reserved(self, store: Any) -> None:
        """Lowering end under values already reserved is refused; the row is unchanged."""
        store.create(SequenceConfig("e"))
        store.reserve("e", 50)
        with pytest.raises(InvalidSequenceConfig, match="end >= 50"):
            maintenance.change(store, "e", end=20)
        assert maintenance.change(store, "e", end=50).exhausted
        assert store.read("e").end == 50

    def test_batch_count_alone_changes_even_after_current_moved(self, store: Any) -> None:
        """A change of batch_count alone applies whatever current did meanwhile."""
        store.create(SequenceConfig("b"))
        store.reserve("b", 30)
        changed = maintenance.change(store, "b", batch_count=7)
        assert (changed.batch_count, changed.current) == (7, 31)

    def test_sync_moves_past_the_floor_never_back(self, store: Any) -> None:
        """sync goes past the largest key in use, and leaves a row already past it."""
        store.create(SequenceConfig("y", start=1, step=10))
        assert maintenance.sync(store, "y", 95).current == 101
        assert maintenance.sync(store, "y", 50).current == 101
        assert maintenance.sync(store, "y", None).current == 101

    def test_adopt_creates_past_the_floor_or_moves_forward(self, store: Any) -> None:
        """adopt creates a missing row past the keys, or moves an existing one past them."""
        row, created = maintenance.adopt(store, SequenceConfig("a"), 41)
        assert (row.current, created) == (42, True)
        row, created = maintenance.adopt(store, SequenceConfig("a"), 99)
        assert (row.current, created) == (100, False)
        assert maintenance.adopt(store, SequenceConfig("a"), 5)[0].current == 100

    def test_concurrent_sets_and_reservations_never_overlap(self, store: Any) -> None:
        """Threads reserving while others set current forward never see a value twice."""
        store.create(SequenceConfig("race", batch_count=10))
        seen: list[int] = []
        errors: list[BaseException] = []
        guard = threading.Lock()

        def reserve() -> None:
            try:
                for _ in range(40):
                    values = list(store.reserve("race", 10).values())
                    with guard:
                        seen.extend(values)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def jump() -> None:
            try:
                for _ in range(20):
                    current = store.read("race").current
                    # a reservation landing in between makes +5 a step back: refused
                    with contextlib.suppress(ValueMovesBackward):
                        maintenance.set_current(store, "race", current + 5)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=reserve) for _ in range(3)]
        threads += [threading.Thread(target=jump) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(seen) == 3 * 40 * 10 == len(set(seen))

    def test_a_bad_row_is_refused_before_any_write_and_repaired_by_force(self, store: Any) -> None:
        """A hand-edited row fails every reservation by name; set --force repairs it."""
        store.create(SequenceConfig("bad"))
        store.reserve("bad", 10)
        self.corrupt(store, "bad", step=0)
        with pytest.raises(InvalidStoredRow, match=r"'bad'.*autoseq set bad VALUE --force"):
            store.reserve("bad", 1)
        with pytest.raises(InvalidStoredRow, match="step"):
            maintenance.repair(store, "bad", 500)  # step unreadable: must be given
        repaired = maintenance.repair(store, "bad", 500, step=1)
        assert (repaired.current, repaired.step) == (500, 1)
        assert store.reserve("bad", 2).first == 500

    def test_a_float_current_is_refused_before_it_is_incremented(self, store: Any) -> None:
        """current stored as a float (a shell's number) is refused with nothing written."""
        store.create(SequenceConfig("fl"))
        store.reserve("fl", 10)
        self.corrupt(store, "fl", current=11.0)
        with pytest.raises(InvalidStoredRow, match="current"):
            store.reserve("fl", 1)
        with pytest.raises(InvalidStoredRow, match="current"):
            store.reserve("fl", 1)  # still refused
        raw = store.read_raw("fl")
        assert float(raw["current"]) == 11.0  # neither attempt incremented it
        assert int(raw["version"]) == 1
        assert maintenance.repair(store, "fl", 11).current == 11
        assert store.reserve("fl", 1).first == 11
