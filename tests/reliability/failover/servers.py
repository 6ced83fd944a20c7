"""Replicated servers built on this machine with the servers' own tools, for failover trials.

A :class:`PostgresPair` is a primary cluster and a streaming standby
(``initdb``, ``pg_basebackup``, ``pg_ctl``), a :class:`RedisPair` a primary
and a replica (``redis-server --replicaof``). Each lives in its own
temporary directory on spare loopback ports, never on the machine's own
servers, and the standby reaches its primary through a
:class:`~tests.reliability.faultproxy.FaultProxy` (``link``): cutting it
leaves the standby behind the primary, as a lagging asynchronous standby
is at the moment its primary dies. ``close()`` stops everything it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ..faultproxy import FaultProxy

PG_BIN = Path(os.environ.get("AUTOSEQ_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"  # initdb refuses to run as root
REDIS_SERVER = shutil.which("redis-server")


def pg_missing() -> str | None:
    """Why a PostgreSQL pair cannot be built here, or None."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (PG_BIN / tool).exists():
            return f"{PG_BIN / tool} not found (set AUTOSEQ_PG_BIN)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(PG_USER)
        except KeyError:
            return f"running as root and there is no {PG_USER!r} user for initdb"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


def redis_missing() -> str | None:
    """Why a Redis pair cannot be built here, or None."""
    return None if REDIS_SERVER else "redis-server not found on PATH"


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_pg_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", PG_USER, "--", *args] if os.geteuid() == 0 else args


def _run(args: list[str], timeout: float = 60.0) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _workdir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(path, PG_USER, PG_USER)
    path.chmod(0o700)
    return path


class PostgresServer:
    """One cluster (data directory) started with ``pg_ctl`` on ``port``."""

    def __init__(self, data: Path, port: int) -> None:
        self.data = data
        self.port = port
        self.running = False

    def pg_ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``pg_ctl`` on this cluster as the PostgreSQL user."""
        return _run(_as_pg_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data), *args]), timeout)

    def start(self) -> None:
        """Start and wait until it accepts connections."""
        self.pg_ctl("-l", str(self.data / "server.log"), "-w", "-t", "60", "start")
        self.running = True

    def crash(self) -> None:
        """Stop at once, as a crash would: no shutdown checkpoint, buffered WAL lost."""
        if self.running:
            self.pg_ctl("-m", "immediate", "-w", "stop")
            self.running = False

    def promote(self) -> None:
        """Make this standby a primary and wait until it accepts writes."""
        self.pg_ctl("-w", "-t", "60", "promote")

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string to this server."""
        return f"host=127.0.0.1 port={self.port} user={PG_USER} dbname={dbname} connect_timeout=5"

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit; the rows it returns."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            cursor = connection.execute(query, params or None)
            return list(cursor.fetchall()) if cursor.description else []

    def configure(self, **settings: str) -> None:
        """``ALTER SYSTEM SET`` each setting, then reload."""
        for name, value in settings.items():
            self.sql(f"ALTER SYSTEM SET {name} = '{value}'")
        self.sql("SELECT pg_reload_conf()")

    def restart(self) -> None:
        """Start again after :meth:`crash` (crash recovery replays what reached the WAL)."""
        self.start()


class PostgresPair:
    """A primary and a streaming standby named ``standby``; ``sync`` makes it synchronous.

    The URL clients use is a multi-host one (``target_session_attrs=read-write``),
    so they find whichever of the two accepts writes, as behind Patroni.
    """

    _template: Path | None = None

    def __init__(self, *, sync: bool = False) -> None:
        self.root = _workdir("autoseq-failover-pg-")
        self.primary = PostgresServer(self.root / "primary", free_port())
        self.standby = PostgresServer(self.root / "standby", free_port())
        self.link: FaultProxy | None = None
        self.sync = sync
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        _run(["cp", "-a", str(self._initdb()), str(self.primary.data)])
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.primary.port}",
            f"unix_socket_directories = '{self.root}'",
            "fsync = off",  # the trials crash processes, never the machine
            "wal_level = replica",
            "max_wal_senders = 4",
            "wal_keep_size = '64MB'",
            "shared_buffers = '16MB'",
            "max_connections = 60",
            "wal_receiver_status_interval = '100ms'",
            "wal_retrieve_retry_interval = '100ms'",
        ]
        if self.sync:
            settings.append("synchronous_standby_names = 'standby'")
        with open(self.primary.data / "postgresql.conf", "a") as conf:
            conf.write("\n".join(settings) + "\n")
        self.primary.start()
        self.link = FaultProxy(self.primary.port)
        _run(
            _as_pg_user(
                [
                    str(PG_BIN / "pg_basebackup"),
                    *("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", PG_USER),
                    *("-D", str(self.standby.data), "-X", "stream", "-c", "fast"),
                ]
            )
        )
        conninfo = f"host=127.0.0.1 port={self.link.port} user={PG_USER} application_name=standby"
        with open(self.standby.data / "postgresql.auto.conf", "a") as conf:
            # Promoted, it has no standby of its own to wait for (Patroni clears it too).
            conf.write(
                f"port = {self.standby.port}\nprimary_conninfo = '{conninfo}'\n"
                "synchronous_standby_names = ''\n"
            )
        (self.standby.data / "standby.signal").touch()
        if os.geteuid() == 0:
            shutil.chown(self.standby.data / "standby.signal", PG_USER, PG_USER)
        self.standby.start()
        self.wait_streaming()

    @classmethod
    def _initdb(cls) -> Path:
        """One ``initdb`` per test session, copied for each primary (initdb takes seconds)."""
        if cls._template is None or not cls._template.exists():
            root = _workdir("autoseq-failover-template-")
            data = root / "data"
            _run(
                _as_pg_user(
                    [
                        *(str(PG_BIN / "initdb"), "-D", str(data), "-U", PG_USER, "-A", "trust"),
                        *("--no-sync", "-E", "UTF8", "--locale=C"),
                    ]
                )
            )
            cls._template = data
        return cls._template

    def url(self, standby_port: int | None = None) -> str:
        """The SQLAlchemy URL clients use: both servers, whichever accepts writes.

        ``standby_port``: reach the standby there instead (a proxy before it).
        """
        standby = self.standby.port if standby_port is None else standby_port
        hosts = f"host=127.0.0.1:{self.primary.port}&host=127.0.0.1:{standby}"
        return f"postgresql+psycopg://{PG_USER}@/postgres?{hosts}&target_session_attrs=read-write"

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Wait until the standby streams (and, if ``sync``, is the synchronous one)."""
        wanted = "sync" if self.sync else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.primary.sql(
                "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
            )
            if any(row[0] == wanted for row in rows):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the standby did not stream ({wanted}) within {timeout}s")

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the standby has replayed everything the primary wrote so far."""
        (target,) = self.primary.sql("SELECT pg_current_wal_lsn()")[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            (behind,) = self.standby.sql(
                "SELECT pg_wal_lsn_diff(%s, pg_last_wal_replay_lsn()) > 0", str(target)
            )[0]
            if not behind:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the standby did not catch up within {timeout}s")

    def fail_over(self) -> None:
        """The primary dies and the standby is promoted (what Patroni does)."""
        self.primary.crash()
        self.standby.promote()

    def close(self) -> None:
        """Stop both servers and the link, and remove their files."""
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.crash()
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """One ``redis-server`` process on ``port``, without persistence."""

    def __init__(self, root: Path, port: int, *extra: str) -> None:
        self.port = port
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(root)),
                *("--save", "", "--appendonly", "no", "--daemonize", "no"),
                *("--logfile", str(root / f"redis-{port}.log")),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = self._connect()

    def _connect(self) -> Any:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: whatever the replica has not received is gone."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.client.close()


class RedisPair:
    """A primary and a replica; clients reach whichever is primary through ``vip``.

    ``vip`` stands for the address Sentinel or a load balancer gives clients:
    after :meth:`fail_over` it leads to the promoted replica.
    """

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autoseq-failover-redis-"))
        self.servers: list[RedisServer] = []
        self.link: FaultProxy | None = None
        self.vip: FaultProxy | None = None
        try:
            self.primary = self._server(free_port())
            self.link = FaultProxy(self.primary.port)
            link = ("--replicaof", "127.0.0.1", str(self.link.port))
            self.replica = self._server(free_port(), *link)
            self.vip = FaultProxy(self.primary.port)
            self.wait_streaming()
        except BaseException:
            self.close()
            raise

    def _server(self, port: int, *extra: str) -> RedisServer:
        server = RedisServer(self.root, port, *extra)
        self.servers.append(server)
        return server

    def url(self) -> str:
        """The ``redis://`` URL clients use (the ``vip``)."""
        assert self.vip is not None
        return f"redis://127.0.0.1:{self.vip.port}/0"

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Wait until the replica is connected and in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.replica.client.info("replication")
            if info.get("master_link_status") == "up":
                return
            time.sleep(0.05)
        raise RuntimeError(f"the replica did not sync within {timeout}s")

    def cut_replica(self, timeout: float = 30.0) -> None:
        """Cut the replica's link and wait until the primary counts it gone."""
        assert self.link is not None
        self.link.cut()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not int(self.primary.client.info("replication").get("connected_slaves", 0)):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the primary still counted its replica after {timeout}s")

    def wait_good_replica(self, timeout: float = 30.0) -> None:
        """Wait until the primary counts its replica as good for ``min-replicas-to-write``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if int(self.primary.client.info("replication").get("min_slaves_good_slaves", 0)):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the primary had no good replica within {timeout}s")

    def fail_over(self) -> None:
        """The primary dies, the replica is promoted and clients are sent to it."""
        assert self.vip is not None
        self.primary.kill()
        self.replica.client.execute_command("REPLICAOF", "NO", "ONE")
        self.vip.cut()
        self.vip.upstream = ("127.0.0.1", self.replica.port)
        self.vip.heal()

    def close(self) -> None:
        """Stop both servers and proxies, and remove their files."""
        for proxy in (self.vip, self.link):
            if proxy is not None:
                proxy.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.kill()
        shutil.rmtree(self.root, ignore_errors=True)


PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)
#: The ports a PgBouncer of the tests may take (spare ones on this machine).
PGBOUNCER_PORTS = range(16400, 16500)


def pgbouncer_missing() -> str | None:
    """Why a PgBouncer cannot be started here, or None."""
    if PGBOUNCER is None:
        return "pgbouncer not found (apt-get install -y pgbouncer)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root (pgbouncer refuses it) and runuser is missing"
    return None


def _spare_port(ports: range) -> int:
    for port in ports:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no spare port in {ports.start}-{ports.stop - 1}")


class PgBouncer:
    """A PgBouncer in ``pool_mode`` in front of ``host:port``, trust auth, on a spare port.

    Run as the PostgreSQL user when this is root (PgBouncer refuses root).
    Few server connections (``pool_size``), so clients share them as they
    do behind a real pooler and a session's state lands on other clients.
    """

    def __init__(
        self, host: str, port: int, *, pool_mode: str = "transaction", pool_size: int = 4
    ) -> None:
        assert PGBOUNCER is not None
        self.root = _workdir("autoseq-pgbouncer-")
        self.port = _spare_port(PGBOUNCER_PORTS)
        users = self.root / "users.txt"
        users.write_text(f'"{PG_USER}" ""\n')
        config = self.root / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\n"
            f"pool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n"
            "max_client_conn = 500\nserver_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        if os.geteuid() == 0:
            for path in (users, config):
                shutil.chown(path, PG_USER, PG_USER)
        self.process = subprocess.Popen(
            _as_pg_user([PGBOUNCER, str(config)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait()
        except BaseException:
            self.close()
            raise

    def _wait(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = (self.root / "pgbouncer.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"pgbouncer did not start on {self.port}: {log}")
            time.sleep(0.05)

    def url(self, dbname: str = "test", query: str = "") -> str:
        """A SQLAlchemy URL through this PgBouncer (``query``: extra URL options)."""
        tail = f"?{query}" if query else ""
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{dbname}{tail}"

    def close(self) -> None:
        """Stop PgBouncer and remove its files."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


#: Ports a local Redis Cluster may use; each node's bus port is its port + 10000.
CLUSTER_PORTS = range(17000, 18000)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(count: int) -> list[int]:
    """``count`` ports in :data:`CLUSTER_PORTS` free now, with their bus ports free too."""
    found: list[int] = []
    start = CLUSTER_PORTS.start + os.getpid() % 500  # parallel runs start apart
    for offset in range(len(CLUSTER_PORTS)):
        port = CLUSTER_PORTS.start + (start - CLUSTER_PORTS.start + offset) % len(CLUSTER_PORTS)
        if _port_free(port) and _port_free(port + 10000):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError(f"no {count} free ports (and bus ports) in {CLUSTER_PORTS}")


def cluster_missing() -> str | None:
    """Why a Redis Cluster cannot be built here, or None."""
    if REDIS_SERVER is None:
        return "redis-server not found on PATH"
    if shutil.which("redis-cli") is None:
        return "redis-cli not found on PATH (it creates the cluster)"
    return None


class LocalRedisCluster:
    """A Redis Cluster of ``primaries`` primaries (and ``replicas`` each) on spare ports.

    Built with ``redis-server --cluster-enabled yes`` and ``redis-cli --cluster
    create``; ``close()`` stops every node and removes its files.
    """

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autoseq-redis-cluster-"))
        self.nodes: list[RedisServer] = []
        try:
            for port in cluster_ports(primaries * (1 + replicas)):
                node_dir = self.root / str(port)
                node_dir.mkdir()
                cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
                timeout = ("--cluster-node-timeout", "2000")
                self.nodes.append(RedisServer(node_dir, port, *cluster, *timeout))
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            options = ["--cluster-replicas", str(replicas), "--cluster-yes"]
            _run(["redis-cli", "--cluster", "create", *addresses, *options], timeout=120)
            self.wait_ok()
        except BaseException:
            self.close()
            raise

    def live(self) -> list[RedisServer]:
        """The nodes still running."""
        return [node for node in self.nodes if node.process.poll() is None]

    def url(self) -> str:
        """A ``redis+cluster://`` URL naming every live node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.live())

    def client(self, **options: Any) -> Any:
        """A ``redis.cluster.RedisCluster`` on this cluster, starting from any live node."""
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode("127.0.0.1", node.port) for node in self.live()]
        return RedisCluster(startup_nodes=nodes, **options)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Wait until every live node says ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [
                node.client.cluster("info")["cluster_state"]
                for node in self.nodes
                if node.process.poll() is None
            ]
            if all(state == "ok" for state in states):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not reach cluster_state:ok within {timeout}s")

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now."""
        return [
            node.port
            for node in self.nodes
            if node.process.poll() is None and node.client.info("replication")["role"] == "master"
        ]

    def node(self, port: int) -> RedisServer:
        """The node listening on ``port``."""
        return next(node for node in self.nodes if node.port == port)

    def close(self) -> None:
        """Stop every node and remove their files."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
