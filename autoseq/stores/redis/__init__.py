"""``RedisStore``: ``sys_sequence`` rows as Redis hashes, reserved by one Lua script.

Layout, for a store with prefix ``P`` (default ``sys_sequence``)::

    {P:<name>}:seq     a hash with the row's fields (name, start, end, step,
                       current, batch, batch_count, cycle, updated_at, version)
    {P:<name>}:worker  a snowflake layout's worker leases (autoseq.stores.redis.workers)
    {P}:names          a sorted set of every name (score 0), for read_all()

``<name>`` is percent-encoded (``urllib.parse.quote`` with nothing safe but
letters, digits and ``_.-~``), so a name holding ``:``, ``*``, ``{`` or a
space can neither reach another sequence's key nor the index, and glob
patterns over the keys stay literal. Each sequence has its own hash tag
``{P:<name>}``: on a Redis Cluster (``redis.cluster.RedisCluster`` or a
``redis+cluster://`` URL) sequences spread over the hash slots, so over the
shards, and every script touches one key. The index is written apart from
the row (before it on create, after it on delete): a name in the index
whose row is missing is skipped.

Stores of autoseq 0.1.0 kept every key under one tag (``{P}:seq:<name>``,
``{P}:worker:<name>``). A row or lease hash found under that old name is
still used where it is (on a single server; a cluster never had them), so
processes of both versions can run side by side;
[`RedisStore.migrate_keys`][autoseq.stores.redis.RedisStore.migrate_keys] moves them to
their own slots once every process runs this version.

A reservation is one ``EVALSHA``. Redis's Lua (5.1) computes in doubles,
exact only below 2**53, while a row holds 64-bit values; so the script only
adds, subtracts and compares, on numbers split into two exact halves (its
one remainder, the step-grid check of ``current``, is long division done
with additions). What needs division or multiplication (the last value a
row can hand out, ``(count - 1) * step``) is computed in Python from the
row's settings, and the script first checks, byte for byte, that the stored
start, end, step, cycle, batch and batch_count are still the ones Python
validated and planned with; if not, it hands the row back and Python plans
again (or refuses the row) before anything is written. ``current`` itself
is read and written inside the script, so concurrent reservations never
retry. The blocks equal
``plan_reservation``'s exactly (tests/stores/test_redis.py checks that on
randomized rows).

Durability: Redis acknowledges a write before it is on disk unless told
otherwise. A Redis that restarts without the rows would let ``create()``
start the sequences again from ``start`` and repeat values already handed
out. Run it with ``appendonly yes`` and ``appendfsync always`` (see
docs/redis.md); ``floor=`` and the store's memory of the highest ``current``
it has seen keep a recreated row above values known to be used.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from autoseq.config import SequenceConfig, utc_now, validate_name
from autoseq.errors import (
    InvalidSequenceConfig,
    InvalidStoredRow,
    ReservationConflict,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.stores._errors import translating, unavailable
from autoseq.stores.base import Block, check_count, check_requests, reset_after_fork
from autoseq.stores.capabilities import one_per_store

if TYPE_CHECKING:
    from autoseq.workers import WorkerLeases

log = logging.getLogger("autoseq")

_PREFIX = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
_INTEGER = re.compile(rb"-?[0-9]{1,20}")
_PLAN_FIELDS = (b"start", b"end", b"step", b"cycle", b"batch", b"batch_count")
_INT_FIELDS = ("start", "end", "step", "current", "batch_count")
_FLAGS = {b"1": True, b"0": False}
#: Any span this large reaches the last value: a row spans less than 2**64.
_SPAN_CAP = 2**64
_MAX_REPLANS = 10
#: No settings known: the reserve script compares them, differs, and hands the row back.
_NO_SETTINGS = [b""] * len(_PLAN_FIELDS)
#: Names one `RedisStore.reserve_many` pipeline carries (per primary): its replies and
#: ``WAIT`` stay well inside ``socket_timeout``.
MANY_CHUNK = 1_000
#: Pipelines per chunk and primary: rows whose settings were not known go again, once read.
MANY_ROUNDS = 3

# A cluster client raises RedisClusterException (not a RedisError) when no node answers.
_REDIS_ERRORS = (redis.RedisError, RedisClusterException)
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: The key kinds a store keeps per name.
KINDS = ("seq", "worker")

# Integers travel as decimal strings and are held as {hi, lo}, value =
# hi * 1e9 + lo with 0 <= lo < 1e9: both halves stay far below 2**53, so
# the doubles of Redis's Lua add, subtract and compare them exactly.
_LUA_INTEGERS = """
local B = 1000000000
local function int(s)
  if type(s) ~= 'string' then return nil end
  local sign, digits = string.match(s, '^(%-?)(%d+)$')
  if not digits or #digits > 20 then return nil end
  local n, hi, lo = #digits, 0, 0
  if n > 9 then
    hi = tonumber(string.sub(digits, 1, n - 9))
    lo = tonumber(string.sub(digits, n - 8))
  else
    lo = tonumber(digits)
  end
  if sign == '-' then
    hi, lo = 0 - hi, 0 - lo
    if lo < 0 then hi, lo = hi - 1, lo + B end
  end
  return {hi, lo}
end
local function cmp(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] and -1 or 1 end
  if a[2] ~= b[2] then return a[2] < b[2] and -1 or 1 end
  return 0
end
local function add(a, b)
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= B then hi, lo = hi + 1, lo - B end
  return {hi, lo}
end
local function sub(a, b)
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo < 0 then hi, lo = hi - 1, lo + B end
  return {hi, lo}
end
local function str(a)
  local hi, lo, sign = a[1], a[2], ''
  if hi < 0 then
    sign = '-'
    if lo > 0 then hi, lo = -1 - hi, B - lo else hi = 0 - hi end
  end
  if hi == 0 then return sign .. string.format('%d', lo) end
  return sign .. string.format('%d%09d', hi, lo)
end
local function mod(a, m)
  -- a mod m for 0 <= a and 0 < m, digit by digit: the remainder stays
  -- below m, and ten times it is built from additions, so nothing is lost.
  local r = {0, 0}
  for c in string.gmatch(str(a), '%d') do
    local r2 = add(r, r)
    local r4 = add(r2, r2)
    r = add(add(add(r4, r4), r2), {0, tonumber(c)})
    while cmp(r, m) >= 0 do r = sub(r, m) end
  end
  return r
end
"""

# KEYS[1] the row. ARGV: start, end, step, cycle, batch, batch_count as
# Python read them (raw); the row's last value; (count - 1) * step, capped;
# '1' to wrap; now. A row whose settings differ goes back to Python (which
# validates them before planning again), and a current off [start, last +
# step] or off the step grid is refused before anything is written. The
# reply carries what Python does not know yet: the block and the new current.
_RESERVE = (
    _LUA_INTEGERS
    + """
local key = KEYS[1]
local row = redis.call('HMGET', key, 'start', 'end', 'step', 'cycle', 'batch', 'batch_count',
                       'current')
if not row[7] then
  if redis.call('EXISTS', key) == 0 then return {'missing'} end
  return {'invalid', redis.call('HGETALL', key)}
end
for i = 1, 6 do
  if row[i] ~= ARGV[i] then return {'stale', redis.call('HGETALL', key)} end
end
local start, step, last = int(row[1]), int(row[3]), int(ARGV[7])
local current = int(row[7])
if not current or cmp(current, start) < 0 or cmp(current, add(last, step)) > 0
   or cmp(mod(sub(current, start), step), {0, 0}) ~= 0 then
  return {'invalid', redis.call('HGETALL', key)}
end
local first, cycled = current, 0
if cmp(first, last) > 0 then
  if ARGV[9] ~= '1' then return {'exhausted', row[7]} end
  first, cycled = start, 1
end
local stop = last
local span = int(ARGV[8])
if cmp(span, sub(last, first)) < 0 then stop = add(first, span) end
local new_current = str(add(stop, step))
redis.call('HSET', key, 'current', new_current, 'updated_at', ARGV[10])
local version = redis.call('HINCRBY', key, 'version', 1)
return {'ok', str(first), str(stop), new_current, cycled, tostring(version)}
"""
)

# KEYS[1] the row (the index is written before, apart: it lives in another
# slot). ARGV: name, then field/value pairs.
_CREATE = """
local created = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'name', unpack(ARGV))
  redis.call('HSET', KEYS[1], 'version', '0')
  created = 1
end
return {created, redis.call('HGETALL', KEYS[1])}
"""

_UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'name', unpack(ARGV))
redis.call('HINCRBY', KEYS[1], 'version', 1)
return redis.call('HGETALL', KEYS[1])
"""

# KEYS[1] the row. ARGV: the version the block's reservation wrote, the
# current it left behind, its first value, now, the next version. A row
# from before versions has none: it counts as 0.
_RELEASE = """
local version = redis.call('HGET', KEYS[1], 'version') or '0'
if version ~= ARGV[1] or redis.call('HGET', KEYS[1], 'current') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'current', ARGV[3], 'updated_at', ARGV[4], 'version', ARGV[5])
return 1
"""

# KEYS[1] the row. ARGV: the expected version, the next version, then the
# row's field/value pairs. Applied only at the expected version, so a write
# re-sent after a lost reply finds the next version and changes nothing.
_COMPARE_AND_SET = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local version = redis.call('HGET', KEYS[1], 'version') or '0'
if version ~= ARGV[1] then return {'stale'} end
redis.call('HSET', KEYS[1], 'version', ARGV[2], unpack(ARGV, 3))
return {'ok', redis.call('HGETALL', KEYS[1])}
"""


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if it can prefix a store's keys, else raise ``InvalidSequenceConfig``."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise InvalidSequenceConfig(
            f"Redis key prefix {prefix!r} must be 1 to 100 letters, digits, '_', '.' or '-' "
            "(no ':', '{' or spaces, so two stores' keys never meet)"
        )
    return prefix


class RedisStore:
    """A [`SequenceStore`][autoseq.stores.base.SequenceStore] keeping rows in Redis hashes.

    ``client_or_url`` is a ``redis.Redis``, a ``redis.cluster.RedisCluster``,
    a ``redis://`` URL or a ``redis+cluster://host:port[,host:port...]`` URL
    (``rediss+cluster://`` with TLS); from a URL the store makes its own
    client with ``socket_timeout`` and ``socket_connect_timeout`` (seconds)
    and one retry, so an outage fails fast. ``prefix`` keeps several stores
    apart on one server. ``floor``, when given, is asked for the lowest value
    a row about to be *created* may start at (say ``max(id) + 1`` of the
    table the sequence numbers, or None): a row recreated after Redis lost
    its data then starts above the values already used instead of at
    ``start``.

    ``replicas``: how many replicas must have each reservation (and each
    worker-lease write) before it is used (``WAIT replicas replica_timeout``
    after it, on the primary that wrote it); a block not acknowledged within
    ``replica_timeout`` seconds is skipped and ``StoreUnavailable`` raised,
    since a failover to a replica without it would hand its values out
    again. ``None`` (the default) waits for as many replicas as that primary
    has been seen to have connected (``INFO replication``), and for one when
    none is but the primary kept a replication backlog for one lately (a
    replica that just dropped off; see `expected_replicas`), so a
    replicated Redis is covered without configuration and a lone one costs
    nothing; ``0`` never waits. On a cluster this holds per shard.
    """

    def __init__(
        self,
        client_or_url: redis.Redis | RedisCluster | str,
        prefix: str = "sys_sequence",
        *,
        floor: Callable[[str], int | None] | None = None,
        socket_timeout: float = 2.0,
        socket_connect_timeout: float = 1.0,
        replicas: int | None = None,
        replica_timeout: float = 0.5,
    ) -> None:
        self.prefix = validate_prefix(prefix)
        self.replication = Replication(replicas, replica_timeout)
        self.floor = floor
        self._timeouts = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        self._url: str | None = None
        #: True on a Redis Cluster: each sequence's keys in their own slot, no legacy names.
        self.cluster = isinstance(client_or_url, RedisCluster)
        if isinstance(client_or_url, str):
            self._url = client_or_url
            self.cluster = client_or_url.partition("://")[0].lower() in _CLUSTER_SCHEMES
            client = self._connect(client_or_url)
            self._owns_client = True
        elif isinstance(client_or_url, (redis.Redis, RedisCluster)):
            client = client_or_url
            self._owns_client = False
        else:
            raise InvalidSequenceConfig(
                "RedisStore needs a redis.Redis or redis.cluster.RedisCluster client, or a "
                f"redis:// or redis+cluster:// URL, got {type(client_or_url).__name__}"
            )
        self._client: Any = client
        self._parent: Any = None  # a forked child's cluster client, made on first use from it
        self._fork_guard = threading.Lock()
        self._nodes = (
            sorted(client.nodes_manager.startup_nodes) if isinstance(client, RedisCluster) else []
        )
        self.index_key = f"{{{self.prefix}}}:names"
        self.reservations = 0
        self._reserve = client.register_script(_RESERVE)
        self._create = client.register_script(_CREATE)
        self._update = client.register_script(_UPDATE)
        self._release = client.register_script(_RELEASE)
        self._compare_and_set = client.register_script(_COMPARE_AND_SET)
        # Per name: the row's settings and the raw stored bytes they were
        # parsed from, which the reserve script compares.
        self._plans: dict[str, tuple[SequenceConfig, list[bytes]]] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._seen: dict[str, int] = {}
        self._seen_lock = threading.Lock()
        self._warned_volatile = False
        reset_after_fork(self)

    def _connect(self, url: str) -> redis.Redis | RedisCluster:
        """A client for ``url``: ``redis+cluster://`` makes a cluster client."""
        scheme, _, rest = url.partition("://")
        base = _CLUSTER_SCHEMES.get(scheme.lower())
        options: dict[str, Any] = {**self._timeouts, "retry": Retry(NoBackoff(), 1)}
        try:
            if base is None:
                return redis.Redis.from_url(url, **options)
            return self._connect_cluster(f"{base}://{rest}", options)
        except ValueError as exc:
            raise InvalidSequenceConfig(
                f"cannot use Redis URL {url!r}: {exc}; write it as redis://host:port/db "
                "or redis+cluster://host:port[,host:port...]"
            ) from None

    def _connect_cluster(self, url: str, options: dict[str, Any]) -> RedisCluster:
        """A cluster client from ``url``, whose host part may list several nodes."""
        scheme, _, rest = url.partition("://")
        netloc, slash, tail = rest.partition("/")
        auth, at, hosts = netloc.rpartition("@")
        first, *others = hosts.split(",")
        startup = [ClusterNode(*_host_port(other)) for other in others]  # type: ignore[no-untyped-call]
        with self._errors("connect", "reaching the Redis Cluster"):
            return RedisCluster.from_url(
                f"{scheme}://{auth}{at}{first}{slash}{tail}",
                startup_nodes=startup or None,
                **options,
            )

    @property
    def client(self) -> Any:
        """The ``redis.Redis`` or ``RedisCluster`` this store sends its commands through."""
        if self._client is None:
            with self._fork_guard:
                if self._client is None:
                    self._client = self._fresh_cluster()
        return self._client

    # keys and errors --------------------------------------------------------

    def key(self, name: str, kind: str = "seq") -> str:
        """The Redis key of sequence ``name``'s hash (``kind="worker"``: its worker leases).

        Every key of one name carries the hash tag ``{prefix:name}``, so it
        has a cluster slot of its own.
        """
        return f"{{{self.prefix}:{_encoded(name)}}}:{kind}"

    def legacy_key(self, name: str, kind: str = "seq") -> str:
        """Where autoseq 0.1.0 kept that key: every name under one hash tag ``{prefix}``."""
        return f"{{{self.prefix}}}:{kind}:{_encoded(name)}"

    def resolve_key(self, name: str, kind: str = "seq") -> str:
        """The key this store uses for ``name``: the legacy one while data is kept there.

        On a single server a hash under
        [`legacy_key`][autoseq.stores.redis.RedisStore.legacy_key] (and none under
        [`key`][autoseq.stores.redis.RedisStore.key]) is used where it is, so older
        processes sharing it keep working; asked once per name and process, and
        again when the legacy hash is gone
        ([`migrate_keys`][autoseq.stores.redis.RedisStore.migrate_keys]). Call inside an
        error translation.
        """
        cached = self._keys.get((name, kind))
        if cached is not None:
            return cached
        key = self.key(name, kind)
        if not self.cluster:
            legacy = self.legacy_key(name, kind)
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(key)
            pipe.exists(legacy)
            has_key, has_legacy = pipe.execute()
            if has_legacy and not has_key:
                key = legacy
        self._keys[(name, kind)] = key
        return key

    def resolve_keys(self, names: list[str]) -> dict[str, str]:
        """`resolve_key` of each row (``kind="seq"``): the names not asked yet in one pipeline."""
        unknown = [name for name in dict.fromkeys(names) if (name, "seq") not in self._keys]
        if unknown and not self.cluster:
            pipe = self.client.pipeline(transaction=False)
            for name in unknown:
                pipe.exists(self.key(name))
                pipe.exists(self.legacy_key(name))
            found = pipe.execute()
            for name, has_key, has_legacy in zip(unknown, found[::2], found[1::2], strict=True):
                legacy = has_legacy and not has_key
                self._keys[(name, "seq")] = self.legacy_key(name) if legacy else self.key(name)
        return {name: self.resolve_key(name) for name in names}

    def moved_from_legacy(self, name: str, kind: str, key: str) -> bool:
        """Whether ``key`` was a legacy key that has since gone: True means look again."""
        if key == self.key(name, kind):
            return False
        self._keys.pop((name, kind), None)
        return True

    def migrate_keys(self) -> int:
        """Move every hash of this prefix from its legacy key to its own slot; how many moved.

        Run it once every process sharing the store runs this version (an
        older one would no longer find the rows it keeps). Each move is one
        ``RENAMENX``, atomic: a process of this version finds the row under
        one name or the other at any moment. A name kept under both is left
        alone and logged.
        """
        if self.cluster:
            return 0
        moved = 0
        with self._errors("migrate", "moving keys to their own hash slots"):
            for kind in KINDS:
                pattern = f"{{{self.prefix}}}:{kind}:*"
                for raw in list(self.client.scan_iter(match=pattern, count=500)):
                    legacy = _bytes(raw).decode()
                    name = unquote(legacy.split(f":{kind}:", 1)[1])
                    if self.client.renamenx(legacy, self.key(name, kind)):
                        moved += 1
                        self._keys.pop((name, kind), None)
                    else:
                        log.warning(
                            "Redis keys %s and %s both exist; left as they are",
                            legacy,
                            self.key(name, kind),
                        )
        return moved

    def _target(self) -> str:
        if self.cluster:
            if self._url is not None:  # the nodes it names, never a password
                scheme, _, rest = self._url.partition("://")
                return f"{scheme}://{rest.partition('/')[0].rpartition('@')[2]}"
            return "redis+cluster://" + ",".join(self._nodes)
        kwargs = self.client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"

    def translate(
        self, exc: BaseException, operation: str, what: str, name: str | None
    ) -> StoreUnavailable:
        """``exc``, a Redis error, as ``StoreUnavailable`` saying ``what`` failed and where."""
        where = f"on {self._target()}"
        return unavailable(exc, operation=operation, what=what, where=where, name=name)

    def _errors(
        self, operation: str, what: str, name: str | None = None
    ) -> AbstractContextManager[None]:
        """Turn a Redis error raised inside into ``StoreUnavailable`` saying ``what`` failed."""
        return translating(_REDIS_ERRORS, self.translate, operation, what, name)

    def _note_seen(self, row: SequenceConfig) -> None:
        with self._seen_lock:
            if row.next_value > self._seen.get(row.name, row.next_value - 1):
                self._seen[row.name] = row.next_value

    # rows -------------------------------------------------------------------

    def _hash(self, name: str) -> dict[bytes, bytes]:
        """``name``'s row as stored (empty when there is none); inside an error translation."""
        key = self.resolve_key(name)
        raw = _pairs(self.client.hgetall(key))
        if not raw and self.moved_from_legacy(name, "seq", key):
            raw = _pairs(self.client.hgetall(self.resolve_key(name)))
        return raw

    def create(self, config: SequenceConfig) -> SequenceConfig:
        self.key(config.name)  # a bad name is refused before anything is sent
        with self._errors("create", f"creating sequence {config.name!r}", config.name):
            if self.floor is not None:
                existing = self._hash(config.name)
                if existing:
                    return self._decode(config.name, existing)
            opening = self._opening(config)
            # the index first: a name listed without its row is skipped, never the reverse
            self.client.zadd(self.index_key, {config.name: 0})
            created, raw = self._create(
                keys=[self.resolve_key(config.name)],
                args=_row_args(opening),
                client=self.client,
            )
        if created:
            if opening.next_value != config.next_value:
                log.warning(
                    "sequence %r: created its row at current=%d instead of %d, above values "
                    "known to be used; was the Redis data lost?",
                    config.name,
                    opening.next_value,
                    config.next_value,
                )
            self._warn_if_volatile()
        return self._decode(config.name, _pairs(raw))

    def _opening(self, config: SequenceConfig) -> SequenceConfig:
        """``config``, moved up to the floor and to the highest current seen here."""
        floors = [self._seen.get(config.name)]
        if self.floor is not None:
            floors.append(self.floor(config.name))
        known = [value for value in floors if value is not None]
        if not known or max(known) <= config.next_value:
            return config
        steps = -(-(max(known) - config.start) // config.step)
        current = min(config.start + steps * config.step, config.last_value + config.step)
        return config.with_current(current)

    def read(self, name: str) -> SequenceConfig | None:
        self.key(name)
        with self._errors("read", f"reading sequence {name!r}", name):
            raw = self._hash(name)
        return self._decode(name, raw) if raw else None

    def read_raw(self, name: str) -> dict[str, Any] | None:
        """The stored hash as plain data, unvalidated (for repairs).

        Integers and the flags ``1``/``0`` are converted; anything else stays
        the string Redis holds, for the repair to refuse.
        """
        self.key(name)
        with self._errors("read", f"reading sequence {name!r}", name):
            raw = self._hash(name)
        if not raw:
            return None
        values: dict[str, Any] = {}
        for field, value in raw.items():
            text = field.decode()
            if text in ("batch", "cycle") and value in _FLAGS:
                values[text] = _FLAGS[value]
            elif _INTEGER.fullmatch(value):
                values[text] = int(value)
            else:
                values[text] = value.decode(errors="replace")
        values["name"] = name
        return values

    def names(self) -> list[str]:
        """Every name in the index, sorted (a name whose row is gone included)."""
        with self._errors("read", "reading sequence names"):
            raw = self.client.zrange(self.index_key, 0, -1)
        return sorted(_bytes(name).decode() for name in raw)

    def read_all(self) -> list[SequenceConfig]:
        names = self.names()
        with self._errors("read", "reading sequences"):
            keys = self.resolve_keys(names)
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(keys[name])
            rows = pipe.execute()
        # A name whose hash is gone (deleted by hand) is skipped, not an error. Each row's
        # settings are kept as read: its first reservation (reserve_many's too) then needs
        # no round trip to learn them.
        found = [
            self._plan(name, _pairs(raw))[0] for name, raw in zip(names, rows, strict=True) if raw
        ]
        return sorted(found, key=lambda row: row.name)

    def update(self, config: SequenceConfig) -> SequenceConfig:
        self.key(config.name)
        with self._errors("update", f"updating sequence {config.name!r}", config.name):
            self.client.zadd(self.index_key, {config.name: 0})
            key = self.resolve_key(config.name)
            raw = self._update(keys=[key], args=_row_args(config), client=self.client)
            if raw is None and self.moved_from_legacy(config.name, "seq", key):
                key = self.resolve_key(config.name)
                raw = self._update(keys=[key], args=_row_args(config), client=self.client)
        if raw is None:
            raise SequenceNotFound(config.name)
        return self._decode(config.name, _pairs(raw))

    def delete(self, name: str) -> bool:
        """Remove a row and its index entry; True if the row existed."""
        self.key(name)
        with self._errors("delete", f"deleting sequence {name!r}", name):
            # the row first: a name listed without its row is skipped, never the reverse
            deleted = self.client.delete(self.key(name), self.legacy_key(name))
            self.client.zrem(self.index_key, name)
        self._plans.pop(name, None)
        self._keys.pop((name, "seq"), None)
        with self._seen_lock:
            self._seen.pop(name, None)
        return bool(deleted)

    def drop_all(self) -> int:
        """Deprecated: `drop()` (every store drops itself by that name)."""
        warnings.warn(
            "RedisStore.drop_all() is deprecated: call drop(); the old name goes in the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.drop()

    def drop(self) -> int:
        """Delete every row of this store's prefix (tests, maintenance); returns how many."""
        with self._errors("drop", "deleting every sequence"):
            keys: list[Any] = []
            # {P}:* is the index and the legacy keys, {P:* the keys of this version
            for pattern in (f"{{{self.prefix}}}:*", f"{{{self.prefix}:*"):
                keys += self.client.scan_iter(match=pattern, count=500)
            pipe = self.client.pipeline(transaction=False)
            for key in keys:  # one by one: on a cluster they live in many slots
                pipe.delete(key)
            pipe.execute()
        self._plans.clear()
        self._keys.clear()
        with self._seen_lock:
            self._seen.clear()
        return sum(1 for key in keys if _bytes(key) != self.index_key.encode())

    # reservation -------------------------------------------------------------

    def reserve(self, name: str, count: int) -> Block:
        self.key(name)
        check_count(count)
        plan = self._plans.get(name)
        for _ in range(_MAX_REPLANS):
            config = plan[0] if plan is not None else None
            stamp = utc_now().isoformat()
            args = _reserve_args(plan, count, stamp, wrap=True)
            with self._errors("reserve", f"reserving from sequence {name!r}", name):
                key = self.resolve_key(name)
                reply, acknowledged, wanted = self.write_script(self._reserve, key, args, name)
            status = _bytes(reply[0])
            if status == b"ok":
                block = self._reserved_block(name, plan, reply, stamp)
                self.reservations += 1
                self.replication.check(name, block.first, block.last, acknowledged, wanted)
                return self._noticed(block)
            if status == b"stale":
                plan = self._plan(name, _pairs(reply[1]))
                continue
            if status == b"exhausted":
                assert config is not None
                raise SequenceExhausted(name, int(_bytes(reply[1])), config.end)
            if status == b"missing":
                if self.moved_from_legacy(name, "seq", key):
                    continue  # migrate_keys() moved it: look for it under its new name
                self._plans.pop(name, None)
                raise self._missing(name)
            # invalid: decoding says what is wrong with the stored row
            self._decode(name, _pairs(reply[1]))
            raise InvalidStoredRow(
                name, "current is outside [start, end] or not start + k * step (in Redis)"
            )
        raise ReservationConflict(
            f"sequence {name!r}: its settings changed {_MAX_REPLANS} times while reserving; "
            "stop the process rewriting the row",
            name=name,
        )

    def _reserved_block(
        self, name: str, plan: tuple[SequenceConfig, list[bytes]] | None, reply: Any, stamp: str
    ) -> Block:
        """The block of an ``ok`` reply of the reserve script, sent with ``plan``'s settings."""
        raw_settings = plan[1] if plan is not None else _NO_SETTINGS
        raw = dict(zip(_PLAN_FIELDS, raw_settings, strict=True))
        raw[b"current"] = _bytes(reply[3])
        raw[b"version"] = _bytes(reply[5])
        raw[b"updated_at"] = stamp.encode()
        row = self._decode(name, raw)
        first, last = int(_bytes(reply[1])), int(_bytes(reply[2]))
        return Block(name, first, last, row.step, row, bool(reply[4]))

    def _noticed(self, block: Block) -> Block:
        """``block``, marked when another primary than before made it (a failover)."""
        if self.replication.failed_over(block.name):
            return dataclasses.replace(block, failover=True)
        return block

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """A block of many sequences in few round trips, each row `reserve`'s script.

        Per `MANY_CHUNK` names, one pipeline per primary holding them (one
        on a single server): the reserve script for each row (one key each,
        so a cluster's slots never meet in a script), then ``WAIT`` for that
        primary's replicas as `reserve` waits, then ``INFO replication``. A
        primary's blocks are used only once its replicas acknowledged them;
        if they did not, they are skipped (gaps), its rows are None and it
        is not asked again in this call. A row whose settings this store
        has not read yet (``read_all`` reads them all) is handed back by the
        script and sent again with them. None for a row missing,
        invalid or exhausted (a cycling row is never wrapped here), for a
        name after its first, and for the rows of a primary that failed; a
        row near ``end`` gets its shorter block, as from `reserve`. A
        failure before any block came back raises ``StoreUnavailable``.
        """
        items = check_requests(requests)
        out: list[Block | None] = [None] * len(items)
        wanted: dict[str, tuple[int, int]] = {}
        for at, (name, count) in enumerate(items):
            self.key(name)  # a bad name is refused before anything is sent
            wanted.setdefault(name, (at, count))
        names = list(wanted)
        got: list[Block] = []
        failed: dict[str, StoreUnavailable] = {}
        try:
            for start in range(0, len(names), MANY_CHUNK):
                chunk = {name: wanted[name][1] for name in names[start : start + MANY_CHUNK]}
                self._reserve_chunk(chunk, got, failed)
        except StoreUnavailable as exc:
            failed["*"] = exc
        if failed and not got:
            raise next(iter(failed.values()))
        if failed:
            log.warning(
                "reserve_many: %d block(s) reserved, the other rows reserve alone: %s",
                len(got),
                next(iter(failed.values())),
            )
        for block in got:
            out[wanted[block.name][0]] = block
        self.reservations += len(got)
        return out

    def _reserve_chunk(
        self, counts: dict[str, int], got: list[Block], failed: dict[str, StoreUnavailable]
    ) -> None:
        """Reserve from ``counts``' rows, adding the blocks to ``got``; a primary that fails
        goes into ``failed`` (by address) and is not asked again."""
        what = f"reserving from {len(counts)} sequence(s)"
        with self._errors("reserve", what):
            keys = self.resolve_keys(list(counts))
        pending = list(counts)
        for _ in range(MANY_ROUNDS):
            with self._errors("reserve", what):
                groups = self._by_primary(pending, keys)
            pending = []
            for node, (client, names) in groups.items():
                if node in failed:
                    continue
                plans = {name: self._plans.get(name) for name in names}
                try:
                    replies = self._send_reservations(node, client, plans, keys, counts)
                except StoreUnavailable as exc:
                    failed[node] = exc
                    continue
                pending += self._take(replies, plans, keys, got)
            if not pending:
                return

    def _by_primary(
        self, names: list[str], keys: dict[str, str]
    ) -> dict[str, tuple[Any, list[str]]]:
        """``names`` grouped by the primary holding their key: {address: (client, names)}."""
        groups: dict[str, tuple[Any, list[str]]] = {}
        for name in names:
            node, client = self._node(keys[name])
            groups.setdefault(node, (client, []))[1].append(name)
        return groups

    def _send_reservations(
        self,
        node: str,
        client: Any,
        plans: dict[str, tuple[SequenceConfig, list[bytes]] | None],
        keys: dict[str, str],
        counts: dict[str, int],
    ) -> dict[str, tuple[Any, str]]:
        """The reserve script for each row of ``plans`` (all on the primary ``node``), in one
        pipeline: {name: (reply, the time it wrote)}, a command refused left out. Sent
        again once for rows a server without the script refused (it wrote nothing)."""
        replies: dict[str, tuple[Any, str]] = {}
        todo = list(plans)
        for _ in range(2):
            stamp = utc_now().isoformat()
            args = {
                name: _reserve_args(plans[name], counts[name], stamp, wrap=False) for name in todo
            }
            sent = self._pipelined(node, client, {name: keys[name] for name in todo}, args)
            replies.update(
                (name, (reply, stamp))
                for name, reply in sent.items()
                if not isinstance(reply, Exception)
            )
            todo = [n for n, r in sent.items() if isinstance(r, redis.exceptions.NoScriptError)]
            if not todo:
                break
            with self._errors("reserve", "loading the reserve script"):
                client.script_load(self._reserve.script)
        return replies

    def _pipelined(
        self, node: str, client: Any, keys: dict[str, str], args: dict[str, list[Any]]
    ) -> dict[str, Any]:
        """One pipeline on the primary ``node``: the reserve script on each of ``keys``, then
        ``WAIT`` and ``INFO replication``; each name's reply (an error as an exception).

        ``StoreUnavailable`` when it fails or the replicas did not acknowledge every write
        within ``replica_timeout``: no block of it may be served then.
        """
        replication = self.replication
        with self._errors("reserve", f"reserving from {len(keys)} sequence(s)"):
            if not replication.knows(node):
                replication.note(node, self._replication_info(client))
            wanted = replication.wanted(node)
            pipe = client.pipeline(transaction=False)
            for name, key in keys.items():
                pipe.evalsha(self._reserve.sha, 1, key, *args[name])
            if wanted:
                pipe.wait(wanted, max(1, int(replication.timeout * 1000)))
            pipe.info("replication")
            try:
                results = pipe.execute(raise_on_error=False)
            except _REDIS_ERRORS:
                if self.cluster:
                    self._refresh()  # a node lost: the next call asks who holds its slots now
                raise
            if wanted and isinstance(results[len(keys)], Exception):
                raise results[len(keys)]  # WAIT refused: the writes cannot be known replicated
        replies = dict(zip(keys, results, strict=False))
        if not isinstance(results[-1], Exception):  # INFO refused (an ACL): nothing learnt
            for name in keys:
                replication.note(node, results[-1], name)
        acknowledged = int(results[len(keys)]) if wanted else 0
        for name, reply in replies.items():
            if not isinstance(reply, Exception) and _bytes(reply[0]) == b"ok":
                first, last = int(_bytes(reply[1])), int(_bytes(reply[2]))
                replication.check(name, first, last, acknowledged, wanted)
        if self.cluster and any(isinstance(r, redis.exceptions.AskError) for r in results):
            self._refresh()  # MOVED: a slot lives elsewhere now; its rows reserve alone
        return replies

    def _take(
        self,
        replies: dict[str, tuple[Any, str]],
        plans: dict[str, tuple[SequenceConfig, list[bytes]] | None],
        keys: dict[str, str],
        got: list[Block],
    ) -> list[str]:
        """Add the blocks of ``ok`` replies to ``got``; the names to send again, whose
        settings the script handed back (now read and planned)."""
        again: list[str] = []
        for name, (reply, stamp) in replies.items():
            status = _bytes(reply[0])
            if status == b"ok":
                got.append(self._noticed(self._reserved_block(name, plans[name], reply, stamp)))
            elif status == b"stale":
                try:
                    self._plan(name, _pairs(reply[1]))
                except InvalidSequenceConfig:
                    continue  # a row no sequence can hold: reserve() says what is wrong
                again.append(name)
            elif status == b"missing":
                self._plans.pop(name, None)
                self.moved_from_legacy(name, "seq", keys[name])
        return again

    def write_script(
        self, script: Any, key: str, args: list[Any], name: str | None = None
    ) -> tuple[Any, int, int]:
        """Run ``script`` on ``key`` and ``WAIT`` for the replicas: (reply, acknowledged, wanted).

        One pipeline on the primary holding ``key``, so ``WAIT`` runs on the
        connection that wrote, and ``INFO replication`` says which primary
        answered (a new one for ``name``: a failover) and its replicas. On a
        cluster a moved slot or a lost node refreshes the slot map and sends
        again (a reply lost with the node costs a block, never repeats one).
        The caller translates errors and decides what too few
        acknowledgements mean.
        """
        replication = self.replication
        for attempt in range(3):
            node, client = self._node(key)
            if not replication.knows(node):
                replication.note(node, self._replication_info(client))
            wanted = replication.wanted(node)
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(script.sha, 1, key, *args)
            if wanted:
                pipe.wait(wanted, max(1, int(replication.timeout * 1000)))
            pipe.info("replication")
            try:
                results = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError):
                if not self.cluster or attempt == 2:
                    raise
                self._refresh()
                continue
            if isinstance(results[0], redis.exceptions.NoScriptError):
                client.script_load(script.script)  # a new or restarted server: load, send again
            elif self.cluster and isinstance(results[0], redis.exceptions.AskError):
                self._refresh()  # MOVED (or ASK): the slot lives elsewhere now
            else:
                break
        for result in results[:-1]:
            if isinstance(result, Exception):
                raise result
        if not isinstance(results[-1], Exception):
            replication.note(node, results[-1], name)
        return results[0], int(results[1]) if wanted else 0, wanted

    def _node(self, key: str) -> tuple[str, Any]:
        """The primary holding ``key`` (its address; '' on one server) and a client on it."""
        if not self.cluster:
            return "", self.client
        node = self.client.get_node_from_key(key)
        return str(node.name), self.client.get_redis_connection(node)

    def _primaries(self) -> list[tuple[str, Any]]:
        """Every primary (address, client): the one server, or each shard's primary."""
        if not self.cluster:
            return [("", self.client)]
        nodes = sorted(self.client.get_primaries(), key=lambda node: node.name)
        return [(str(node.name), self.client.get_redis_connection(node)) for node in nodes]

    def _refresh(self) -> None:
        """Read the cluster's slot map again (after MOVED or a node lost)."""
        self.client.nodes_manager.initialize()

    @staticmethod
    def _replication_info(client: Any) -> Mapping[str, Any]:
        try:
            info: Mapping[str, Any] = client.info("replication")
        except redis.ResponseError:  # INFO refused (an ACL): nothing known, nothing waited for
            return {}
        return info

    def _missing(self, name: str) -> SequenceNotFound:
        seen = self._seen.get(name)
        if seen is None:
            return SequenceNotFound(name)
        return SequenceNotFound(
            name,
            f"its row was in Redis earlier (current was {seen}) and is gone: Redis lost "
            "its data (restart without appendonly?). Recreating it at start would repeat "
            f"values; recreate it with current >= {seen} (`autoseq set`)",
        )

    def _plan(self, name: str, raw: Mapping[bytes, bytes]) -> tuple[SequenceConfig, list[bytes]]:
        row = self._decode(name, raw)
        plan = (row, [raw[field] for field in _PLAN_FIELDS])
        self._plans[name] = plan
        return plan

    def release(self, block: Block) -> bool:
        self.key(block.name)
        with self._errors("release", f"releasing a block of {block.name!r}", block.name):
            released = self._release(
                keys=[self.resolve_key(block.name)],
                args=[
                    block.version,
                    block.last + block.step,
                    block.first,
                    utc_now().isoformat(),
                    block.version + 1,
                ],
                client=self.client,
            )
        return bool(released)

    def release_many(self, blocks: list[Block]) -> list[bool]:
        """``release`` of each block, the same script each, sent in one pipeline.

        One round trip instead of one per block (a shutdown of thousands of
        sequences); each hand-back stays its own compare-and-set. On a
        cluster, one call each (a pipeline there cannot carry scripts).
        """
        if not blocks:
            return []
        if self.cluster:
            return [self.release(block) for block in blocks]
        for block in blocks:
            self.key(block.name)  # a bad name is refused before anything is sent
        with self._errors("release", f"releasing {len(blocks)} block(s)"):
            keys = [self.resolve_key(block.name) for block in blocks]
            now = utc_now().isoformat()
            pipe = self.client.pipeline(transaction=False)
            for key, block in zip(keys, blocks, strict=True):
                self._release(
                    keys=[key],
                    args=[
                        block.version,
                        block.last + block.step,
                        block.first,
                        now,
                        block.version + 1,
                    ],
                    client=pipe,
                )
            replies = pipe.execute()
        return [bool(reply) for reply in replies]

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        self.key(row.name)
        args = [version, version + 1, *_row_args(row)[1:]]  # the name is the key's
        with self._errors("compare_and_set", f"writing sequence {row.name!r}", row.name):
            key = self.resolve_key(row.name)
            reply, acknowledged, wanted = self.write_script(
                self._compare_and_set, key, args, row.name
            )
            if _bytes(reply[0]) == b"missing" and self.moved_from_legacy(row.name, "seq", key):
                key = self.resolve_key(row.name)
                reply, acknowledged, wanted = self.write_script(
                    self._compare_and_set, key, args, row.name
                )
        status = _bytes(reply[0])
        if status == b"missing":
            raise SequenceNotFound(row.name)
        self._plans.pop(row.name, None)
        if status != b"ok":
            return None
        if acknowledged < wanted:
            # Written on the primary only: a failover now would bring the row back as it was
            # (a forward move undone, then values below it handed out again).
            raise StoreUnavailable(
                f"sequence {row.name!r}: {acknowledged} of {wanted} Redis replica(s) "
                f"acknowledged the write of current={row.next_value} within "
                f"{self.replication.timeout}s; a failover to a replica without it would bring "
                "the row back as it was. Bring the replicas back and run the command again "
                "(it reads the row anew), or pass RedisStore(replicas=...) the number that must "
                "have each write",
                name=row.name,
                operation="compare_and_set",
                reason="not replicated",
            )
        return self._decode(row.name, _pairs(reply[1]))

    # rows as Redis holds them -------------------------------------------------

    def _decode(self, name: str, raw: Mapping[bytes, bytes]) -> SequenceConfig:
        def bad(field: str, problem: str) -> InvalidSequenceConfig:
            return InvalidStoredRow(name, f"{field} {problem} (in Redis)")

        values: dict[str, Any] = {"name": name}
        for field in _INT_FIELDS:
            value = raw.get(field.encode())
            if value is None or not _INTEGER.fullmatch(value):
                raise bad(field, f"is {value!r}, not an integer")
            values[field] = int(value)
        for field in ("batch", "cycle"):
            value = raw.get(field.encode())
            if value not in _FLAGS:
                raise bad(field, f"is {value!r}, not 1 or 0")
            values[field] = _FLAGS[value]
        version = raw.get(b"version", b"0")
        if not _INTEGER.fullmatch(version):
            raise bad("version", f"is {version!r}, not an integer")
        values["version"] = int(version)
        stamp = raw.get(b"updated_at")
        try:
            values["updated_at"] = datetime.fromisoformat(stamp.decode()) if stamp else None
        except ValueError:
            raise bad("updated_at", f"is {stamp!r}, not an ISO 8601 time") from None
        stored_name = raw.get(b"name")
        if stored_name is not None and stored_name != name.encode():
            raise bad("name", f"is {stored_name!r}, not {name!r}")
        row = SequenceConfig.from_row(values)
        self._note_seen(row)
        return row

    def persistence(self) -> dict[str, str]:
        """The server settings that decide whether rows survive ({} if CONFIG is refused).

        ``appendonly`` and ``appendfsync`` (a restart keeps every acknowledged
        reservation only with ``yes`` and ``always``) and ``maxmemory-policy``
        (an ``allkeys-*`` policy may evict a row, which then starts over). On
        a cluster, the least safe value any primary has.
        """
        settings: dict[str, str] = {}
        try:
            for _, client in self._primaries():
                for pattern in ("append*", "maxmemory-policy"):
                    for key, value in client.config_get(pattern).items():
                        name, text = _bytes(key).decode(), _bytes(value).decode()
                        if name not in settings or not _safe(name, text):
                            settings[name] = text  # the first, or one that loses rows
        except _REDIS_ERRORS:
            return {}
        return settings

    def replication_findings(self) -> list[tuple[str, str]]:
        """(level, message) pairs for ``doctor``: could a failover repeat values?

        On a cluster, one finding per shard, named by its primary.
        """
        findings: list[tuple[str, str]] = []
        with self._errors("doctor", "reading INFO replication"):
            for node, client in self._primaries():
                where = f"primary {node}: " if self.cluster else ""
                info = self._replication_info(client)
                findings += [(level, where + text) for level, text in self._findings(info)]
        return findings

    def _findings(self, info: Mapping[str, Any]) -> list[tuple[str, str]]:
        if not info:
            return [("warning", "INFO replication was refused: replicas cannot be checked")]
        if info.get("role") != "master":
            return [("error", "this Redis is a replica: reservations cannot be written here")]
        connected = int(info.get("connected_slaves", 0))
        wanted = self.replication.replicas
        if wanted is None and expected_replicas(info) > connected:
            return [
                (
                    "warning",
                    "no replica connected, but this primary kept a replication backlog for "
                    "one lately: reservations wait for it and fail until it is back; pass "
                    "RedisStore(replicas=0) if it is gone for good",
                )
            ]
        if connected and wanted == 0:
            return [
                (
                    "warning",
                    f"{connected} replica(s) connected but RedisStore(replicas=0) does not wait "
                    "for them: a failover to one can hand out again values served from a "
                    "block it had not received; leave replicas=None (the default) or set it",
                )
            ]
        if wanted is not None and wanted > connected:
            return [
                (
                    "error",
                    f"RedisStore(replicas={wanted}) but {connected} replica(s) connected: every "
                    "reservation fails until they are back",
                )
            ]
        if connected:
            waits = connected if wanted is None else wanted
            return [("ok", f"each reservation waits for {waits} of {connected} replica(s)")]
        return []

    def _warn_if_volatile(self) -> None:
        if self._warned_volatile:
            return
        self._warned_volatile = True
        settings = self.persistence()
        if not settings:
            return
        if settings.get("appendonly") != "yes" or settings.get("appendfsync") != "always":
            log.warning(
                "Redis at %s keeps sequences with appendonly=%s appendfsync=%s: a restart "
                "can lose reservations and repeat values; set appendonly yes and "
                "appendfsync always (docs/redis.md)",
                self._target(),
                settings.get("appendonly"),
                settings.get("appendfsync"),
            )
        if settings.get("maxmemory-policy", "").startswith("allkeys"):
            log.warning(
                "Redis at %s has maxmemory-policy=%s: it may evict a sequence row, which "
                "would then start over and repeat values; use noeviction (docs/redis.md)",
                self._target(),
                settings["maxmemory-policy"],
            )

    # lifecycle ----------------------------------------------------------------

    # capabilities (autoseq.stores.capabilities) ---------------------------

    def worker_leases(self) -> WorkerLeases:
        """Snowflake worker-id leases in a hash beside this store's rows."""
        from autoseq.stores.redis.workers import RedisWorkers

        return one_per_store(self, lambda: RedisWorkers(self))

    def stored_names(self) -> list[str]:
        """Every row's name, from the index, including rows that fail validation."""
        try:
            raw = self.client.zrange(self.index_key, 0, -1)
        except redis.RedisError as exc:
            raise StoreUnavailable(f"reading sequence names failed: {exc}") from exc
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in raw)

    def doctor_findings(self) -> list[tuple[str, str, str]]:
        """What ``autoseq doctor`` checks on this store beyond its rows."""
        from autoseq.stores.redis._doctor import findings

        return findings(self)

    def location(self) -> str:
        """The server and the key prefix."""
        return f"{self._target()} prefix {self.prefix}"

    def after_fork(self) -> None:
        # The parent's sockets stay the parent's: a client of our own with the
        # same settings (a caller's client is left to redis-py's own pid check).
        # A cluster client connects as it is made: made on first use, so a
        # fork never waits on (or fails for) a cluster this child may not use.
        if self.cluster:
            if self._client is not None:
                self._parent = self._client
            self._client = None
            self._fork_guard = threading.Lock()
        else:
            pool = self.client.connection_pool
            fresh = redis.ConnectionPool(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **pool.connection_kwargs,
            )
            self._client = redis.Redis(connection_pool=fresh)
        self._owns_client = True

    def _fresh_cluster(self) -> RedisCluster:
        """A new cluster client like the current one, knowing nothing of its connections."""
        if self._url is not None:
            return self._connect_cluster(
                self._url.replace("+cluster", "", 1),
                {**self._timeouts, "retry": Retry(NoBackoff(), 1)},
            )
        old = self._parent
        startup = [ClusterNode(node.host, node.port) for node in old.get_nodes()]  # type: ignore[no-untyped-call]
        kwargs = {
            key: value
            for key, value in old.nodes_manager.connection_kwargs.items()
            if key not in ("host", "port")
        }
        return RedisCluster(startup_nodes=startup, **kwargs)

    def close(self) -> None:
        if not self._owns_client:
            return
        if self._client is None:
            return  # a forked child that never used its cluster client
        if self.cluster:
            # each node's connections, as redis.Redis.close() does: the client stays
            # usable (RedisCluster.close() would forget the slot map for good)
            for node in self._client.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.close()
        else:
            self.client.close()


class Replication:
    """What a `RedisStore` knows of its primaries' replicas, and what it waits for.

    Per primary (its address; '' on one server): its replication id and the
    most replicas seen connected to it. ``replicas`` fixed, or ``None``:
    that count. Per sequence: the replication id of the primary that made
    its last reservation; a reservation made by another one (a promoted
    replica, a restart that lost the data, a slot moved) says ``failover``,
    so the blocks buffered before are dropped.
    """

    def __init__(self, replicas: int | None, timeout: float) -> None:
        if replicas is not None and (
            isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0
        ):
            raise InvalidSequenceConfig(
                f"replicas={replicas!r}; use the number of replicas that must have a "
                "reservation before it is served (0: none), or None to wait for those connected"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidSequenceConfig(f"replica_timeout={timeout!r}; use seconds above 0")
        self.replicas = replicas
        self.timeout = float(timeout)
        self._primaries: dict[str, tuple[str | None, int]] = {}
        self._served_by: dict[str, str] = {}
        self._failed_over: set[str] = set()
        self._warned: set[str] = set()
        self._guard = threading.Lock()

    def knows(self, node: str) -> bool:
        """Whether ``INFO replication`` of the primary at ``node`` was seen."""
        return node in self._primaries

    def wanted(self, node: str = "") -> int:
        """How many replicas the next write on the primary at ``node`` waits for."""
        if self.replicas is not None:
            return self.replicas
        return self._primaries.get(node, (None, 0))[1]

    def note(self, node: str, info: Mapping[str, Any], name: str | None = None) -> None:
        """Take in an ``INFO replication`` reply of ``node``, after a write for ``name``."""
        replid = info.get("master_replid")
        with self._guard:
            known, seen = self._primaries.get(node, (None, 0))
            if replid is not None and replid != known:
                seen = 0  # a new primary here: its replicas are counted afresh
            if info.get("role") == "master":
                seen = max(seen, expected_replicas(info))
            self._primaries[node] = (replid if replid is not None else known, seen)
            if name is None or replid is None:
                return
            before = self._served_by.get(name)
            self._served_by[name] = replid
            if before is None or before == replid:
                return
            self._failed_over.add(name)
            if replid not in self._warned:
                self._warned.add(replid)
                log.warning(
                    "Redis primary changed (replication id %s, was %s): a failover, or a "
                    "restart without the data; blocks reserved before are dropped",
                    replid,
                    before,
                )

    def check(self, name: str, first: int, last: int, acknowledged: int, wanted: int) -> None:
        """Raise unless ``wanted`` replicas acknowledged the reservation of ``first..last``."""
        if acknowledged >= wanted:
            return
        raise StoreUnavailable(
            f"sequence {name!r}: {acknowledged} of {wanted} Redis replica(s) acknowledged the "
            f"reservation of {first}..{last} within {self.timeout}s; those values are skipped, "
            "since a failover to a replica without them would hand them out again. Bring the "
            "replicas back, or pass RedisStore(replicas=...) the number that must have each "
            "reservation (0: never wait, and accept repeats after a failover)",
            name=name,
            operation="reserve",
            reason="not replicated",
        )

    def failed_over(self, name: str) -> bool:
        """Whether ``name``'s last reservation came from another primary than the one before."""
        with self._guard:
            if name in self._failed_over:
                self._failed_over.discard(name)
                return True
        return False


def expected_replicas(info: Mapping[str, Any]) -> int:
    """How many replicas a primary's ``INFO replication`` says it should have.

    Those connected; and at least one when none is but the primary keeps a
    replication backlog (made when a replica attached, kept for
    ``repl-backlog-ttl``) and was not itself promoted (``second_repl_offset``
    -1): a replica that dropped off a moment ago, so a process started now
    still waits for it rather than write what a failover would lose.
    """
    connected = int(info.get("connected_slaves", 0))
    lost = int(info.get("repl_backlog_active", 0)) and int(info.get("second_repl_offset", -1)) == -1
    return 1 if connected == 0 and lost else connected


def _reserve_args(
    plan: tuple[SequenceConfig, list[bytes]] | None, count: int, stamp: str, *, wrap: bool
) -> list[bytes | str | int]:
    """The reserve script's ARGV for ``count`` values planned with ``plan``; a cycling row
    wraps only with ``wrap``. Without a plan the script hands the row back to read."""
    if plan is None:
        return [*_NO_SETTINGS, 0, 0, "0", stamp]
    config, raw_settings = plan
    span = min((count - 1) * config.step, _SPAN_CAP)
    wraps = "1" if config.cycle and wrap else "0"
    return [*raw_settings, config.last_value, span, wraps, stamp]


def _row_args(config: SequenceConfig) -> list[str | int]:
    row = config.as_row()
    args: list[str | int] = [config.name]
    for field in ("start", "end", "step", "current", "batch", "batch_count", "cycle"):
        value = row[field]
        args += [field, int(value)]
    return [*args, "updated_at", utc_now().isoformat()]


def _bytes(value: Any) -> bytes:
    # A caller's client may decode replies (decode_responses=True).
    return value.encode() if isinstance(value, str) else bytes(value)


def _pairs(raw: Any) -> dict[bytes, bytes]:
    """An HGETALL reply (a mapping, or a flat list from a script) with bytes keys and values."""
    items = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2], strict=True)
    return {_bytes(key): _bytes(value) for key, value in items}


def _safe(setting: str, value: str) -> bool:
    """Whether a persistence setting's value keeps every acknowledged row."""
    if setting == "maxmemory-policy":
        return not value.startswith("allkeys")
    return {"appendonly": "yes", "appendfsync": "always"}.get(setting, value) == value


def _encoded(name: str) -> str:
    """``name`` percent-encoded for a key, after checking it is a valid sequence name."""
    validate_name(name)
    try:
        return quote(name, safe="")
    except UnicodeEncodeError:
        raise InvalidSequenceConfig(
            f"sequence name {name!r} is not valid Unicode text; use printable text"
        ) from None


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)
