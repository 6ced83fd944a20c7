"""What ``autoseq doctor`` checks on a ``RedisStore``: persistence and replication."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoseq.stores.capabilities import replication_check

if TYPE_CHECKING:
    from autoseq.stores.redis import RedisStore

#: (level, check, message): a doctor finding.
Finding = tuple[str, str, str]


def findings(store: RedisStore) -> list[Finding]:
    """The store's own findings, in the order doctor reports them."""
    return [*_persistence(store), *replication_check(store)]


def _persistence(store: RedisStore) -> list[Finding]:
    found: list[Finding] = []
    settings = store.persistence()
    if not settings:
        found.append(
            (
                "warning",
                "redis_persistence",
                "CONFIG GET was refused, so persistence cannot be checked: make sure of "
                "appendonly yes, appendfsync always and maxmemory-policy noeviction "
                "(docs/redis.md)",
            )
        )
        return found
    appendonly = settings.get("appendonly")
    fsync = settings.get("appendfsync")
    policy = settings.get("maxmemory-policy", "")
    if appendonly != "yes":
        found.append(
            (
                "error",
                "redis_persistence",
                f"appendonly={appendonly}: a restart loses reservations and values repeat; "
                "set appendonly yes and appendfsync always",
            )
        )
    elif fsync != "always":
        found.append(
            (
                "warning",
                "redis_persistence",
                f"appendfsync={fsync}: a crash can lose the last second of reservations "
                "(values then repeat); set appendfsync always",
            )
        )
    if policy.startswith("allkeys"):
        found.append(
            (
                "error",
                "redis_persistence",
                f"maxmemory-policy={policy} may evict a sequence row, which then starts over; "
                "use noeviction",
            )
        )
    if appendonly == "yes" and fsync == "always" and not policy.startswith("allkeys"):
        found.append(
            (
                "ok",
                "redis_persistence",
                f"appendonly=yes appendfsync=always maxmemory-policy={policy or '?'}",
            )
        )
    return found
