"""``distlock`` (and ``python -m distlock``): list locks, show one with its queue, force-release a stuck holder.

    distlock --url etcd://127.0.0.1:2379 list [--prefix P]
    distlock --url etcd://127.0.0.1:2379 show NAME
    distlock --url etcd://127.0.0.1:2379 force-release NAME --token N
    distlock --url sql+postgresql://user@host/db sql-tables [--print-only] [--upgrade]
    distlock --version

The URL may also come from ``DISTLOCK_URL``; ``--json`` prints one JSON document, for scripts. It talks to the lock
service with :func:`distlock.connect`, needs no framework, and works while the application is down.
``force-release`` removes the holder only if its token is still ``N``, so a lock that changed hands is never taken
from its new holder; ``sql-tables`` creates the SQL lock table's missing tables (or only prints their DDL), and with
``--upgrade`` marks tables of the earlier release as of this one's layout (once none of its clients runs).
Operators' guide: docs/operations/stuck-locks.md.

What can go wrong, as the exit status: 1 ``force-release`` changed nothing (no holder, or another token); 2 a bad
command line or input (a malformed or missing URL, a bad token, a bad name such as an empty one: names are checked
before connecting); 3 the lock service failed (unreachable, refused the credentials). Every failure is one message
on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from . import __version__
from ._client import Client, connect
from ._errors import ConfigurationError, DistlockError
from ._names import validate_name
from ._protocol import PROCESSES, Holder, LockState
from ._table import format_lock_table

__all__ = ["main"]

PROG = "distlock"
#: Exit statuses (see the module docstring).
NOT_RELEASED, BAD_INPUT, SERVICE_FAILED = 1, 2, 3


def _parser() -> argparse.ArgumentParser:
    # --url and --json are accepted before or after the command; after it, SUPPRESS keeps an absent option from
    # overriding one given before it.
    def common(default: Any) -> argparse.ArgumentParser:
        options = argparse.ArgumentParser(add_help=False)
        options.add_argument(
            "--url", default=default, help="the lock service, e.g. etcd://127.0.0.1:2379 (default: $DISTLOCK_URL)"
        )
        options.add_argument("--json", action="store_true", default=default, help="print JSON, for scripts")
        options.add_argument(
            "--connect-timeout",
            type=float,
            default=default,
            metavar="SECONDS",
            help="how long to try to reach the service (default 5)",
        )
        return options

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect distlock locks and force-release a stuck holder, against any distlock URL.",
        epilog="exit status: 0 done, 1 force-release changed nothing, 2 bad input, 3 the lock service failed",
        parents=[common(None)],
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.set_defaults(json=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    after = common(argparse.SUPPRESS)
    listing = commands.add_parser("list", parents=[after], help="every lock with its holders and waiters")
    listing.add_argument("--prefix", default="", help="only locks whose name starts with this")
    show = commands.add_parser("show", parents=[after], help="one lock: its holders and its waiters in order")
    show.add_argument("name", help="the lock's name")
    release = commands.add_parser(
        "force-release",
        parents=[after],
        help="remove a lock's holder if its token is still N; the next waiter gets the lock",
    )
    release.add_argument("name", help="the lock's name")
    release.add_argument("--token", required=True, type=int, help="the holder's fencing token, as list/show print it")
    tables = commands.add_parser(
        "sql-tables", parents=[after], help="create the SQL lock table's tables (sql+... URLs) and print their DDL"
    )
    tables.add_argument("--print-only", action="store_true", help="only print the DDL; connect to nothing")
    tables.add_argument(
        "--upgrade",
        action="store_true",
        help="mark existing tables as of this release's layout; ONLY once no client of the earlier release runs",
    )
    return parser


def _sql_tables(url: str, args: argparse.Namespace, options: dict[str, Any]) -> int:
    from .backends import parse_url, scheme_of
    from .backends.sqltable._url import SqlTableConfig

    scheme = scheme_of(url.partition("://")[0])
    if scheme is None or scheme.backend != "sqltable":
        print(
            f"{PROG}: sql-tables needs a SQL lock table URL (sql+postgresql://, sql+mysql://, sql+sqlite:///)",
            file=sys.stderr,
        )
        return BAD_INPUT
    config = parse_url(url, **options)
    assert isinstance(config, SqlTableConfig)
    if not args.print_only:
        with connect(url, **options) as client:  # connecting creates what is missing
            if args.upgrade:
                from .backends.sqltable._backend import SqlTableBackend

                backend = client._backend
                assert isinstance(backend, SqlTableBackend)
                backend.upgrade_layout()
    from .backends.sqltable._schema import layout_ddl, table_ddl

    marker = "\n\n".join(f"{statement};" for statement in layout_ddl(config.url, config.prefix))
    if args.upgrade:
        print(marker)
        return 0
    print("\n\n".join(f"{statement};" for statement in table_ddl(config.url, config.prefix)))
    print(
        "\n-- The layout marker: on a fresh install, or as the upgrade step once no client of the earlier release runs"
    )
    print(marker)
    return 0


def _state_json(state: LockState) -> dict[str, Any]:
    return dataclasses.asdict(state)


def _holder_text(holder: Holder | str | None) -> str:
    if isinstance(holder, str):
        return holder
    if holder is None:
        return "nobody holds it now"
    if holder.holders > 1:  # a semaphore's slots or readers: the first of them, and how many hold beside it
        return f"its first holder's token is {holder.token} (owner {holder.owner}; {holder.holders} hold it)"
    return f"its holder's token is {holder.token} (owner {holder.owner})"


def _run(client: Client, args: argparse.Namespace) -> int:
    if args.command == "list":
        states = [state for state in client.inspect() if state.name.startswith(args.prefix)]
        print(json.dumps([_state_json(s) for s in states], indent=2) if args.json else format_lock_table(states))
        return 0
    if args.command == "show":
        found = [state for state in client.inspect() if state.name == args.name]
        if args.json:
            print(json.dumps(_state_json(found[0]) if found else None, indent=2))
        elif found:
            print(format_lock_table(found))
        else:
            print(f"lock {args.name!r} is free: no holder, no waiters")
        return 0
    released = client.force_release(args.name, args.token)
    try:
        holder: Holder | str | None = client.holder(args.name)
    except DistlockError as e:  # the release itself is done (or not): say so, whatever this read says
        holder = f"its holder could not be read ({e})"
    if args.json:
        now = dataclasses.asdict(holder) if isinstance(holder, Holder) else None
        print(json.dumps({"name": args.name, "token": args.token, "released": released, "holder": now}, indent=2))
    elif released:
        print(f"released lock {args.name!r} at token {args.token}; {_holder_text(holder)}")
    else:
        print(
            f"{PROG}: lock {args.name!r} was not released: {_holder_text(holder)}, not {args.token}; nothing changed",
            file=sys.stderr,
        )
    return 0 if released else NOT_RELEASED


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    url = args.url or os.environ.get("DISTLOCK_URL")
    if not url:
        print(f"{PROG}: no lock service: pass --url URL or set DISTLOCK_URL", file=sys.stderr)
        return BAD_INPUT
    options = {} if args.connect_timeout is None else {"connect_timeout": args.connect_timeout}
    try:
        if "name" in args:
            validate_name(args.name)
        if args.command == "sql-tables":
            return _sql_tables(url, args, options)
        with connect(url, **options) as client:
            client._context.require(PROCESSES, "the distlock command (another process)")
            return _run(client, args)
    except ConfigurationError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return BAD_INPUT
    except DistlockError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return SERVICE_FAILED
    except KeyboardInterrupt:
        return 130
