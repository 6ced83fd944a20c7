"""The store contract: every store's test module subclasses ``StoreContract``.

A subclass only provides the ``store`` fixture (a fresh, empty store on its
real server); every behaviour below is then checked against that store.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from autoseq import (
    MAX_VALUE,
    InvalidSequenceConfig,
    SequenceConfig,
    SequenceExhausted,
    SequenceNotFound,
    SequenceRegistry,
)
from autoseq.stores import Block, SequenceStore

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
    """Behaviour every ``SequenceStore`` must have, checked on a real server."""

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

    def test_bad_count_is_refused(self, store: Any) -> None:
        """A reservation of zero values is refused with InvalidSequenceConfig."""
        store.create(SequenceConfig("z"))
        with pytest.raises(InvalidSequenceConfig):
            store.reserve("z", 0)
        assert store.read("z").current == 1

    @pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
    def test_hostile_names_round_trip_as_data(self, store: Any, name: str) -> None:
        """Names full of SQL or MongoDB operators are stored and matched as plain data."""
        store.create(SequenceConfig("bystander"))
        store.create(SequenceConfig(name, start=42))
        assert store.reserve(name, 2).first == 42
        assert store.read(name).name == name
        assert store.read("bystander").current == 1
        assert {row.name for row in store.read_all()} == {"bystander", name}

    def test_invalid_names_are_refused(self, store: Any) -> None:
        """Non-string or empty names get InvalidSequenceConfig before any I/O."""
        for bad in (None, 12, "", " padded ", "a\x00b", "y" * 192):
            with pytest.raises(InvalidSequenceConfig):
                store.reserve(bad, 1)  # type: ignore[arg-type]
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

    def test_registry_serves_through_store(self, store: Any) -> None:
        """A registry on this store serves ordered values and hands the tail back on close."""
        registry = SequenceRegistry(store, auto_create=True)
        values = [registry.next("orders") for _ in range(250)] + registry.next_many("orders", 1000)
        assert values == list(range(1, 1251))
        registry.close()
        assert store.read("orders").current == 1251
