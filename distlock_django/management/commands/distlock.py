"""``manage.py distlock``: list held locks, their waiters, tokens and lease time left (live from the service).

``--prefix`` narrows the list to lock names that start with it (default ``DISTLOCK["KEY_PREFIX"]``). What can go
wrong: any ``DistlockError`` (an unreachable service, bad settings) becomes a ``CommandError``: the message on
stderr, exit status 1.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import distlock
from distlock_django._client import get_client
from distlock_django._conf import conf


class Command(BaseCommand):
    help = "List distributed locks: holders, queued waiters, fencing tokens and lease time left."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--prefix", default=None, help="only locks whose name starts with this")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            prefix = conf()["KEY_PREFIX"] if options["prefix"] is None else options["prefix"]
            table = distlock.format_lock_table(get_client().inspect(), prefix=prefix)
        except distlock.DistlockError as e:
            raise CommandError(f"cannot read locks: {e}") from e
        self.stdout.write(table)  # the same table as the framework-free `distlock list`
