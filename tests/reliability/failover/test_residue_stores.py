"""Independent stores on disjoint residue classes: no value twice, and one down stops no other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from backends import sql_url, unique_table

from autoseq import BufferPolicy, SequenceLock
from autoseq.residues import check_disjoint, residue_class
from autoseq.stores import SQLStore

from ..faultproxy import FaultProxy
from .traffic import Client, Count, Traffic

pytestmark = [pytest.mark.postgres, pytest.mark.mysql]

POLICY = BufferPolicy(max_batch_count=50, retry_initial=0.01, retry_max=0.1, wait_timeout=1.0)


@pytest.fixture
def regions(tmp_path: Path) -> Iterator[tuple[FaultProxy, list[SQLStore]]]:
    """Three independent stores (PostgreSQL behind a proxy, MariaDB, SQLite), one class each."""
    postgres = sa.engine.make_url(sql_url("postgres", tmp_path))
    proxy = FaultProxy(postgres.port or 5432)
    urls = [
        postgres.set(port=proxy.port).render_as_string(hide_password=False),
        sql_url("mysql", tmp_path),
        sql_url("sqlite", tmp_path),
    ]
    stores = [
        SQLStore(url, table=unique_table("region"), connect_timeout=1, statement_timeout=1.0)
        for url in urls
    ]
    configs = [residue_class("orders", i, len(stores), batch_count=50) for i in range(3)]
    check_disjoint(configs)
    for store, config in zip(stores, configs, strict=True):
        store.create_table()
        store.create(config)
    yield proxy, stores
    proxy.heal()
    for store in stores:
        store.drop()
        store.close()
    proxy.close()


def test_disjoint_classes_serve_on_while_one_store_is_down(
    regions: tuple[FaultProxy, list[SQLStore]],
) -> None:
    """Three regions take values; PostgreSQL's is cut off: the others keep serving, none twice."""
    proxy, stores = regions
    clients = [
        Client(SequenceLock("orders", store, batch_count=50, policy=POLICY), threads=2)
        for store in stores
    ]
    with Traffic(clients) as traffic:
        traffic.run_until(0.5, traffic.all_moved_since([0, 0, 0]))
        proxy.cut()
        traffic.run_until(0.3)  # the cut region serves out what it holds, then fails
        marks = traffic.marks()
        errors_before = clients[0].errors
        traffic.run_until(1.5, lambda: clients[0].errors > errors_before)
        during = [now - then for now, then in zip(traffic.marks(), marks, strict=True)]
        proxy.heal()
        traffic.run_until(0.5, traffic.all_moved_since(traffic.marks()))
    count = Count.of(clients, [0, 0, 0])
    print(f"residue classes: {count}; during the cut: {during}")
    assert clients[0].errors > errors_before  # the region was really down
    assert during[1] > 0
    assert during[2] > 0
    assert count.twice == 0
    for index, client in enumerate(clients):
        assert all(value % 3 == (1 + index) % 3 for value in client.values)
