"""A WSGI app that serves values and autoseq's metrics, run in several processes by
``test_metrics_multiprocess.py``: under gunicorn (``multiprocess_app:app``) or
alone (``python multiprocess_app.py N``: serve N values, then answer on a port).

The database, the sequence and a delay per request come from the environment
(``AUTOSEQ_TEST_DB_URL``, ``AUTOSEQ_TEST_SEQUENCE``, ``AUTOSEQ_TEST_DELAY``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from autoseq import BufferPolicy, SequenceConfig, SequenceLock, SequenceRegistry, metrics
from autoseq.stores import SQLStore

# Blocks of exactly 100 and no prefetch: the reservations each process makes are known.
_POLICY = BufferPolicy(prefetch=False, max_batch_count=100)
_registry: SequenceRegistry | None = None
_guard = threading.Lock()
_metrics = metrics.wsgi_app()  # installed before the first reservation


def lock() -> SequenceLock:
    """This process's lock of the test sequence."""
    global _registry
    with _guard:
        if _registry is None:
            store = SQLStore(os.environ["AUTOSEQ_TEST_DB_URL"])
            _registry = SequenceRegistry(store, policy=_POLICY)
    return _registry.register(SequenceConfig(os.environ["AUTOSEQ_TEST_SEQUENCE"], batch_count=100))


def report(values: list[int]) -> bytes:
    """What a process says about itself: its pid, the values it served, its lock's stats()."""
    stats = lock().stats()
    figures = {
        key: stats[key]
        for key in ("reservations", "reserved_values", "current_block_left", "next_block_left")
    }
    return json.dumps({"pid": os.getpid(), "values": values, "stats": figures}).encode()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """``/metrics``: the metrics; ``/serve?n=N``: N values of the sequence."""
    if environ["PATH_INFO"] == "/metrics":
        return list(_metrics(environ, start_response))
    count = int(parse_qs(environ["QUERY_STRING"])["n"][0])
    values = lock().next_many(count)
    time.sleep(float(os.environ.get("AUTOSEQ_TEST_DELAY", "0")))
    start_response("200 OK", [("Content-Type", "application/json")])
    return [report(values)]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> None:
    """Serve N values, answer on a port (printed with the report), stop when stdin closes."""
    values = lock().next_many(int(sys.argv[1]))
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_port, **json.loads(report(values))}), flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
