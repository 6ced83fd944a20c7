"""The lock-free fast path: values from the block in hand are served without the lock.

On a GIL build a value comes from one step of a range iterator, atomic
between threads; the lock is taken only to switch blocks, and whoever needs
to know exactly what is unserved (a bulk, close()) ends the iterator
first, in constant time however large the block. These tests count
duplicates across threads racing on every path.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry
from autoseq import lock as autoseq_lock
from autoseq.lock import GIL
from autoseq.stores import MemoryStore
from autoseq.testing import FlakyStore

needs_gil = pytest.mark.skipif(not GIL, reason="the lock-free path is for GIL builds only")


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Let the interpreter switch threads every 10 µs, so threads meet inside the slow path."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a serving thread hung"


@needs_gil
def test_next_takes_no_lock_while_a_block_is_in_hand() -> None:
    """With the sequence's lock held elsewhere, next() still serves from the block in hand."""
    lock = SequenceRegistry(MemoryStore()).register(SequenceConfig("free", batch_count=1000))
    assert lock.next() == 1
    got: list[int] = []
    with lock._lock:  # another thread switching blocks, say
        reader = threading.Thread(target=lambda: got.extend(lock.next() for _ in range(50)))
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive(), "next() waited for the lock"
    assert got == list(range(2, 52))
    lock.close()


@pytest.mark.parametrize("path", ["lock-free", "locked"])
@pytest.mark.parametrize("batch_count", [1, 7, 100])
def test_sixteen_threads_on_next_and_next_many_never_share_a_value(
    batch_count: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 threads mixing next() and next_many() over small blocks: no value twice, in order.

    ``locked`` is the path a free-threaded build takes (every step of the
    iterator under the lock), forced here on a GIL build.
    """
    if path == "lock-free" and not GIL:
        pytest.skip("the lock-free path is for GIL builds only")
    store = FlakyStore(MemoryStore(), delay=0.0005)
    registry = SequenceRegistry(store, policy=BufferPolicy(max_batch_count=batch_count * 4))
    lock = registry.register(SequenceConfig("race", batch_count=batch_count))
    if path == "locked":
        monkeypatch.setattr(autoseq_lock, "GIL", False)
    take_one = lock.next if path == "lock-free" else lock._next_locked
    per_thread: list[list[int]] = [[] for _ in range(16)]

    def serve(index: int) -> None:
        mine = per_thread[index]
        for round_ in range(300):
            if (index + round_) % 5 == 0:
                mine.extend(lock.next_many(1 + (index + round_) % 13))
            else:
                mine.append(take_one())

    _run([threading.Thread(target=serve, args=(i,)) for i in range(16)])
    every = [value for values in per_thread for value in values]
    assert len(every) == len(set(every))
    for values in per_thread:
        assert values == sorted(values)
    lock.close()


def test_close_while_threads_serve_hands_back_only_unserved_values() -> None:
    """close() racing 8 serving threads: the tail it hands back holds no served value."""
    store = MemoryStore()
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch=False))
    lock = registry.register(SequenceConfig("tail", batch_count=100_000))
    lock.next()
    served: list[list[int]] = [[] for _ in range(8)]
    started = threading.Barrier(9)

    def serve(index: int) -> None:
        started.wait()
        try:
            while True:
                served[index].append(lock.next())
        except Exception:
            return

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    handed_back = lock.close()
    for thread in threads:
        thread.join(timeout=30)
    every = [1] + [value for values in served for value in values]
    assert len(every) == len(set(every))
    row = store.read("tail")
    assert row is not None
    assert handed_back
    # After the hand-back, current is the first unserved value: past every served one.
    assert row.next_value == max(every) + 1
    again = SequenceRegistry(store).register(SequenceConfig("tail"))
    assert again.next() == max(every) + 1
    again.close()


def test_stats_and_peek_follow_the_fast_path() -> None:
    """stats() and peek() see values the fast path served without the lock."""
    lock = SequenceRegistry(MemoryStore()).register(
        SequenceConfig("look", batch_count=100), policy=BufferPolicy(prefetch=False)
    )
    for _ in range(30):
        lock.next()
    assert lock.peek() == 31
    stats: Any = lock.stats()
    assert stats["current_block_left"] == 70
    assert lock.next_many(3) == [31, 32, 33]
    lock.close()


@needs_gil
def test_threads_piled_up_at_the_prefetch_point_of_a_huge_block_pass_at_once() -> None:
    """8 threads waiting on the lock at a prefetch point of a 2**26 block all pass within 2 s.

    The first re-arms the rest of the block; each of the others then settles
    that run before it takes its value, which walked 67 million values apiece
    before (seconds each) and is now constant time.
    """
    store = FlakyStore(MemoryStore(), delay=0.02)
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch_at=1e-6))
    lock = registry.register(SequenceConfig("pile", batch_count=2**26))
    # int(2**26 * 1e-6) = 67 values up to the prefetch point; the 67th comes
    # from the fast path, which is then empty until the lock is taken.
    assert [*lock.next_many(66), lock.next()] == list(range(1, 68))
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(lock.next())) for _ in range(8)]
    with lock._lock:
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # each finds the fast path empty and waits for the lock
        released = time.perf_counter()
    for thread in threads:
        thread.join(timeout=120)
    passed = time.perf_counter() - released
    assert sorted(got) == list(range(68, 76))
    assert passed < 2.0  # a walk through the block took about 4 s apiece here
    lock.close()


@needs_gil
def test_sixteen_threads_on_huge_blocks_get_unique_increasing_values_without_a_stall(
    switch_often: None,
) -> None:
    """16 threads on 2**26 blocks past a prefetch point: no value twice, no call over 2 s.

    Threads switching every 10 µs meet in the slow path at the prefetch
    point while the rest of the block is armed, as threads of a web server
    do; none may wait for a walk through the block.
    """
    store = FlakyStore(MemoryStore(), delay=0.02)
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch_at=1e-4))
    lock = registry.register(SequenceConfig("stall", batch_count=2**26))
    per_thread: list[list[int]] = [[] for _ in range(16)]
    slowest = [0.0] * 16
    start = threading.Barrier(16)

    def serve(index: int) -> None:
        mine, clock, worst = per_thread[index], time.perf_counter, 0.0
        start.wait()
        for _ in range(5_000):
            began = clock()
            mine.append(lock.next())
            worst = max(worst, clock() - began)
        slowest[index] = worst

    _run([threading.Thread(target=serve, args=(i,)) for i in range(16)])
    every = [value for values in per_thread for value in values]
    assert len(every) == len(set(every)) == 80_000
    assert all(values == sorted(values) for values in per_thread)
    assert max(slowest) < 2.0
    lock.close()  # waits for the prefetch in flight
    assert store.reservations == 2  # the first block, and the one its prefetch point asked for
