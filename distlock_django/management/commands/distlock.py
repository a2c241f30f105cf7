"""``manage.py distlock``: list held locks, their waiters, tokens and lease time left (live from the service).

``--prefix`` narrows the list to lock names that start with it (default ``DISTLOCK["KEY_PREFIX"]``). What can go
wrong: any ``DistlockError`` (an unreachable service, bad settings) becomes a ``CommandError``: the message on
stderr, exit status 1.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import distlock
from distlock_django._inspect import lock_table


class Command(BaseCommand):
    help = "List distributed locks: holders, queued waiters, fencing tokens and lease time left."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--prefix", default=None, help="only locks whose name starts with this")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            rows = lock_table(options["prefix"])
        except distlock.DistlockError as e:
            raise CommandError(f"cannot read locks: {e}") from e
        if not rows:
            self.stdout.write("no locks held")
            return
        width = max(len(row.name) for row in rows)
        self.stdout.write(f"{'LOCK':<{width}}  {'ROLE':<9}  {'TOKEN':>10}  {'LEASE LEFT':>10}  OWNER")
        for row in rows:
            role = "holder" if row.position == 0 else f"waiter {row.position}"
            left = "-" if row.ttl_left is None else f"{row.ttl_left:.0f} s"
            self.stdout.write(f"{row.name:<{width}}  {role:<9}  {row.token:>10}  {left:>10}  {row.owner}")
