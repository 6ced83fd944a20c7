"""Worker leases in a Redis hash beside a ``RedisStore``'s rows.

``{P:<name>}:worker`` (``<name>`` percent-encoded as for sequences; a hash
kept by autoseq 0.1.0 under ``{P}:worker:<name>`` is used where it is) maps
each worker id to ``"<expires_ms> <last_ms> <version> <owner>"`` (an empty
owner: released). Each operation is one Lua script on that one key, so every
compare-and-set is atomic, on one server or a cluster. Timestamps travel as
decimal strings written by Python and are only compared in Lua (as doubles,
exact far beyond any millisecond timestamp).

Each lease write waits for the store's replicas as a reservation does
(``RedisStore(replicas=...)``): a lease taken, renewed or recorded that the
replicas did not acknowledge is not used, since a failover to a replica
without it could hand the worker id to a second generator while the first
still issues ids with it. A release is not waited for: lost, it leaves the
lease held until it expires, which repeats nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import redis
from redis.exceptions import RedisClusterException

from autoseq.errors import StoreUnavailable
from autoseq.workers import LAYOUT_ROW, WorkerLease, layout_row

if TYPE_CHECKING:
    from autoseq.stores.redis import RedisStore

_PARSE = """
local function parse(v)
  local e, l, ver, o = string.match(v, '^(%d+) (%d+) (%d+) (.*)$')
  return e, l, ver, o
end
"""

# ARGV: owner, count, now_ms, expires_ms. Reply: {worker, old expires, old last, version}.
# The lowest free id whose high water is not ahead of now_ms, else the free
# one ahead by the least (a clock that ran ahead used it).
_ACQUIRE = (
    _PARSE
    + """
local now = tonumber(ARGV[3])
local pick, pick_ahead, pick_v = nil, nil, nil
for w = 0, tonumber(ARGV[2]) - 1 do
  local v = redis.call('HGET', KEYS[1], tostring(w))
  local ahead = nil
  if not v then
    ahead = 0
  else
    local e, l, ver, o = parse(v)
    if e and (o == '' or tonumber(e) < now) then
      ahead = math.max(math.max(tonumber(e), tonumber(l)) - now, 0)
    end
  end
  if ahead and (not pick_ahead or ahead < pick_ahead) then
    pick, pick_ahead, pick_v = w, ahead, v
  end
  if pick_ahead == 0 then break end
end
if not pick then return false end
local field = tostring(pick)
if not pick_v then
  redis.call('HSET', KEYS[1], field, ARGV[4] .. ' 0 1 ' .. ARGV[1])
  return {pick, '0', '0', '1'}
end
local e, l, ver, o = parse(pick_v)
local version = tostring(tonumber(ver) + 1)
redis.call('HSET', KEYS[1], field, ARGV[4] .. ' ' .. l .. ' ' .. version .. ' ' .. ARGV[1])
return {pick, e, l, version}
"""
)

# ARGV: the layout row as written if none is. Reply: the row recorded.
_CLAIM = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v then return v end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""

# ARGV: worker, owner, expires_ms, last_ms, '1' to release. Reply: the new version or false.
_WRITE = (
    _PARSE
    + """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then return false end
local e, l, ver, o = parse(v)
if not e or o ~= ARGV[2] then return false end
local version = tostring(tonumber(ver) + 1)
local owner, expires, last = ARGV[2], ARGV[3], ARGV[4]
if ARGV[5] == '1' then
  owner = ''
else
  -- never shortened: a renewal sent later may already have extended it
  if tonumber(e) > tonumber(expires) then expires = e end
  if tonumber(l) > tonumber(last) then last = l end
end
redis.call('HSET', KEYS[1], ARGV[1], expires .. ' ' .. last .. ' ' .. version .. ' ' .. owner)
return version
"""
)


_ERRORS = (redis.RedisError, RedisClusterException)


class RedisWorkers:
    """`WorkerLeases` on a ``RedisStore``'s server."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._acquire = store.client.register_script(_ACQUIRE)
        self._write = store.client.register_script(_WRITE)
        self._claim = store.client.register_script(_CLAIM)

    def key(self, name: str) -> str:
        """The hash holding layout ``name``'s leases (in a hash slot of its own)."""
        return self.store.key(name, "worker")

    def _call(
        self, script: Any, name: str, args: list[Any], what: str, *, durable: bool = True
    ) -> Any:
        """``script``'s reply on ``name``'s lease hash, once the replicas have it (``durable``)."""
        try:
            # through the store: after a fork it has a new client
            key = self.store.resolve_key(name, "worker")
            reply, acknowledged, wanted = self.store.write_script(script, key, args)
        except _ERRORS as exc:
            raise self._fail(exc, what, name) from exc
        if durable and acknowledged < wanted:
            raise StoreUnavailable(
                f"snowflake {name!r}: {acknowledged} of {wanted} Redis replica(s) acknowledged "
                f"{what} within {self.store.replication.timeout}s, so it is not used: a "
                "failover to a replica without it could give the worker id to a second "
                "generator. Bring the replicas back, or pass RedisStore(replicas=...) the "
                "number that must have each write (0: never wait)",
                name=name,
                operation="lease",
                reason="not replicated",
            )
        return reply

    def _fail(self, exc: BaseException, what: str, name: str | None) -> StoreUnavailable:
        return self.store.translate(exc, "lease", what, name)

    def acquire_worker(
        self, name: str, owner: str, count: int, now_ms: int, ttl_ms: int
    ) -> WorkerLease | None:
        expires = now_ms + ttl_ms
        self.key(name)
        reply = self._call(
            self._acquire,
            name,
            [owner, count, now_ms, expires],
            f"leasing a worker id of snowflake {name!r}",
        )
        if not reply:
            return None
        worker, old_expires, old_last, version = (int(x) for x in reply)
        return WorkerLease(
            name, worker, owner, expires, old_last, version, max(old_expires, old_last)
        )

    def renew_worker(
        self, lease: WorkerLease, now_ms: int, ttl_ms: int, last_ms: int
    ) -> WorkerLease | None:
        expires = max(now_ms + ttl_ms, lease.expires_ms)
        last = max(last_ms, lease.last_ms)
        version = self._call(
            self._write,
            lease.name,
            [lease.worker, lease.owner, expires, last, "0"],
            f"renewing worker {lease.worker}",
        )
        if not version:
            return None
        return WorkerLease(lease.name, lease.worker, lease.owner, expires, last, int(version))

    def release_worker(self, lease: WorkerLease, last_ms: int) -> bool:
        last = max(last_ms, lease.last_ms)
        version = self._call(
            self._write,
            lease.name,
            [lease.worker, lease.owner, last, last, "1"],
            f"releasing worker {lease.worker}",
            durable=False,
        )
        return bool(version)

    def claim_layout(self, name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease:
        self.key(name)
        fresh = layout_row(name, layout, now_ms, wait_ms)
        recorded = self._call(
            self._claim,
            name,
            [LAYOUT_ROW, _text(fresh)],
            f"recording the layout of snowflake {name!r}",
        )
        return _row(name, LAYOUT_ROW, recorded)

    def list_workers(self, name: str | None = None, *, layouts: bool = False) -> list[WorkerLease]:
        store = self.store
        try:
            names = [name] if name is not None else self._names()
            rows = []
            for layout in names:
                key = store.resolve_key(layout, "worker")
                for field, value in store.client.hgetall(key).items():
                    if layouts or int(field) != LAYOUT_ROW:
                        rows.append(_row(layout, int(field), value))
        except _ERRORS as exc:
            raise self._fail(exc, "listing worker leases", name) from exc
        return sorted(rows, key=lambda r: (r.name, r.worker))

    def _names(self) -> list[str]:
        """Every layout with a lease hash, under this version's key or autoseq 0.1.0's."""
        prefix = self.store.prefix
        names = set()
        for pattern in (f"{{{prefix}:*}}:worker", f"{{{prefix}}}:worker:*"):
            for raw in self.store.client.scan_iter(match=pattern, count=500):
                key = raw.decode() if isinstance(raw, bytes) else raw
                if key.startswith(f"{{{prefix}}}:"):
                    names.add(unquote(key.split(":worker:", 1)[1]))
                else:
                    names.add(unquote(key[len(prefix) + 2 : -len("}:worker")]))
        return sorted(names)


def _text(row: WorkerLease) -> str:
    return f"{row.expires_ms} {row.last_ms} {row.version} {row.owner or ''}"


def _row(name: str, worker: int, value: str | bytes) -> WorkerLease:
    text = value.decode() if isinstance(value, bytes) else value
    expires, last, version, owner = text.split(" ", 3)
    return WorkerLease(name, worker, owner or None, int(expires), int(last), int(version))
