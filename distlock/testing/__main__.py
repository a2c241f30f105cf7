"""``python -m distlock.testing``: run one throwaway server from the command line, printing its URL until Ctrl-C.

    python -m distlock.testing etcd               # etcd://127.0.0.1:<port>
    python -m distlock.testing etcd --members 3   # a three-member cluster
    python -m distlock.testing etcd --etcd-version 3.4   # on Debian's etcd 3.4 (find_etcd(version="3.4"))
    python -m distlock.testing redis              # redis://127.0.0.1:<port>/0
    python -m distlock.testing postgres           # postgresql://distlock@127.0.0.1:<port>/distlock
    python -m distlock.testing zookeeper          # zk://127.0.0.1:<port> (--members 3: an ensemble)
    python -m distlock.testing mariadb            # sql+mysql://distlock:distlock@127.0.0.1:<port>/distlock
    python -m distlock.testing redis --port 6390  # on a port of your choice (any one server; not a cluster)

Without a server it prints its usage. The URL is the only line on stdout (for ``$(...)`` or a pipe); the log's
path goes to stderr. Ctrl-C or SIGTERM stops the server and removes its directory.

What can go wrong: a missing binary, as root no user to run PostgreSQL as (``--create-user`` creates one), or a
``--port`` in use or out of range is reported as the `ConfigurationError` of the harness, a server that does not
start as a `HarnessError` with its log's tail; both exit with status 1. ``--port`` with ``--members`` above 1 is a
usage error (status 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from distlock._errors import ConfigurationError
from distlock.testing import (
    EtcdCluster,
    EtcdServer,
    HarnessError,
    MariaDBServer,
    PostgresServer,
    RedisServer,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    find_etcd,
)

__all__: list[str] = []


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # unwinds through `with`, which closes the server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distlock.testing",
        description="Start a throwaway etcd, Redis, PostgreSQL, MariaDB or ZooKeeper on loopback, print its URL, run "
        "until Ctrl-C.",
        epilog="example: python -m distlock.testing etcd --members 3  (prints etcd://127.0.0.1:<p1>,...)",
    )
    parser.add_argument("server", nargs="?", choices=["etcd", "redis", "postgres", "mariadb", "zookeeper"])
    parser.add_argument("--members", type=int, default=1, help="etcd, zookeeper: members (default 1)")
    parser.add_argument(
        "--port", type=int, help="the port clients connect to, 1-65535 (default: a free one); one server only"
    )
    parser.add_argument("--tls", action="store_true", help="etcd: serve TLS with client certificates")
    parser.add_argument("--etcd-version", help="etcd: run a binary of this release line, e.g. 3.4 (default: any)")
    parser.add_argument("--appendonly", action="store_true", help="redis: keep writes across kill and restart")
    parser.add_argument(
        "--create-user", action="store_true", help="postgres as root: create the user to run it as if missing"
    )
    args = parser.parse_args(argv)
    if args.server is None:
        parser.print_help()
        return 0
    if args.port is not None and args.members > 1:
        parser.error("--port names one server's port; the members of a cluster take free ports")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # Started in the background by a shell, Python inherits SIGINT ignored: let `kill -INT` stop it like Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    server: (
        EtcdCluster | EtcdServer | RedisServer | PostgresServer | MariaDBServer | ZooKeeperServer | ZooKeeperEnsemble
    )
    try:
        if args.server == "etcd":
            binary = find_etcd(version=args.etcd_version)
            if args.members > 1:
                server = EtcdCluster(args.members, tls=args.tls, binary=binary)
            else:
                server = EtcdServer(tls=args.tls, binary=binary, port=args.port)
        elif args.server == "redis":
            server = RedisServer(appendonly=args.appendonly, port=args.port)
        elif args.server == "zookeeper":
            server = ZooKeeperEnsemble(args.members) if args.members > 1 else ZooKeeperServer(port=args.port)
        elif args.server == "mariadb":
            server = MariaDBServer(port=args.port)
        else:
            server = PostgresServer(create_user=args.create_user, port=args.port)
        with server:
            if isinstance(server, EtcdCluster | ZooKeeperEnsemble):
                url, logs = server.url, ", ".join(str(member.log_path) for member in server.members)
            else:
                url, logs = (server.dsn if isinstance(server, PostgresServer) else server.url), str(server.log_path)
            print(url, flush=True)
            print(f"log: {logs}\nCtrl-C stops it.", file=sys.stderr, flush=True)
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    except (ConfigurationError, HarnessError) as exc:
        print(f"python -m distlock.testing: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
