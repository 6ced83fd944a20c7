"""RegistryCache: the one cache of registries every integration keeps."""

from __future__ import annotations

import os
import threading
import time

import pytest

from autoseq import SequenceConfig, SequenceRegistry
from autoseq.registry import RegistryCache
from autoseq.stores import MemoryStore


def test_a_key_is_built_once_however_many_threads_ask() -> None:
    """Concurrent first uses of one key build one registry and all get it."""
    cache: RegistryCache[str] = RegistryCache()
    built: list[SequenceRegistry] = []

    def build() -> SequenceRegistry:
        time.sleep(0.01)  # widen the window two builders would need
        built.append(SequenceRegistry(MemoryStore()))
        return built[-1]

    got: list[SequenceRegistry] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("k", build))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1
    assert all(registry is built[0] for registry in got)
    assert cache.find("k") is built[0]
    assert cache.find("other") is None


def test_a_registry_built_on_another_tag_is_stale_and_rebuilt() -> None:
    """A new tag (a reconnected client) hands the old registry to on_stale and builds anew."""
    cache: RegistryCache[str] = RegistryCache()
    old_client, new_client = object(), object()
    stale: list[SequenceRegistry] = []
    first = cache.get("k", lambda: SequenceRegistry(MemoryStore()), tag=old_client)
    assert cache.get("k", lambda: SequenceRegistry(MemoryStore()), tag=old_client) is first
    second = cache.get(
        "k", lambda: SequenceRegistry(MemoryStore()), tag=new_client, on_stale=stale.append
    )
    assert second is not first
    assert stale == [first]


def test_close_all_hands_tails_back_and_forgets() -> None:
    """close_all closes every registry (unused values go back) and empties the cache."""
    cache: RegistryCache[str] = RegistryCache()
    store = MemoryStore()
    registry = cache.get("k", lambda: SequenceRegistry(store))
    lock = registry.register(SequenceConfig("s", batch_count=10))
    assert lock.next() == 1
    cache.close_all()
    assert cache.registries() == []
    row = store.read("s")
    assert row is not None
    assert row.next_value == 2  # 2..10 handed back


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_the_cache_is_locked_can_still_use_it() -> None:
    """A fork while another thread holds the cache's lock leaves the child a lock of its own."""
    cache: RegistryCache[str] = RegistryCache()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache._guard:
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = threading.Event()

        def use() -> None:
            cache.get("k", lambda: SequenceRegistry(MemoryStore()))
            ok.set()

        threading.Thread(target=use, daemon=True).start()
        os._exit(0 if ok.wait(5) else 1)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child deadlocked on the parent's lock"


def test_load_builds_no_lock_until_a_sequence_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: load() of N rows validates them but builds a lock only on first use,
    from the row it read (no second read); every registry view still sees the names."""
    import autoseq.registry
    from autoseq.lock import SequenceLock

    class CountingStore(MemoryStore):
        reads = 0

        def read(self, name: str) -> SequenceConfig | None:
            self.reads += 1
            return super().read(name)

    built: list[str] = []

    class CountedLock(SequenceLock):
        def __init__(self, name: str, *args: object, **kwargs: object) -> None:
            built.append(name)
            super().__init__(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(autoseq.registry, "SequenceLock", CountedLock)
    store = CountingStore()
    names = [f"s{i:03d}" for i in range(300)]
    for name in names:
        store.create(SequenceConfig(name, batch_count=7))
    registry = SequenceRegistry(store)
    assert registry.load() == names
    assert built == []
    assert registry.names() == names
    assert registry.peek("s001") is None
    assert registry.next("s001") == 1
    assert registry.next_many("s002", 2) == [1, 2]
    assert built == ["s001", "s002"]
    assert registry.find("s003") is not None
    assert registry.get("s003") is registry.find("s003")
    assert registry.register(SequenceConfig("s004", batch_count=50)).next() == 1
    assert registry.discard("s005")
    assert "s005" not in registry.names()
    assert built == ["s001", "s002", "s003", "s004"]
    assert store.reads == 0  # locks came from load()'s rows
    assert len(registry.stats()) == len(names) - 1
    assert registry.close_locks() == []
    assert registry.names() == []
