"""``manage.py distlock``: list held locks, their waiters, tokens and lease time left (live from the service); or
force-release one lock's holder.

``--prefix`` narrows the list to lock names that start with it (default ``DISTLOCK["KEY_PREFIX"]``).
``--force-release NAME --token N`` removes lock NAME's holder only if its fencing token is still N (the token the
list showed), as the admin's lock page does: the next waiter gets the lock, the holder sees it lost. NAME may be
given with or without ``KEY_PREFIX``, as the admin's search takes it (``_inspect.spellings``): the name as given is
tried first, then under the key prefix. What can go
wrong: any ``DistlockError`` (an unreachable service, bad settings, a bad name or token) becomes a ``CommandError``:
the message on stderr, exit status 1; so does a release that found another holder or none (nothing is changed).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import distlock
from distlock_django._client import get_client
from distlock_django._conf import conf
from distlock_django._inspect import spellings


class Command(BaseCommand):
    help = (
        "List distributed locks: holders, queued waiters, fencing tokens and lease time left; "
        "or force-release one lock's holder (--force-release NAME --token N)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--prefix", default=None, help="only locks whose name starts with this")
        parser.add_argument("--force-release", metavar="NAME", default=None, help="release this lock's holder")
        parser.add_argument("--token", type=int, default=None, help="the holder's fencing token, as the list shows it")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["force_release"] is not None or options["token"] is not None:
            self._force_release(options["force_release"], options["token"])
            return
        try:
            prefix = conf()["KEY_PREFIX"] if options["prefix"] is None else options["prefix"]
            table = distlock.format_lock_table(get_client().inspect(), prefix=prefix)
        except distlock.DistlockError as e:
            raise CommandError(f"cannot read locks: {e}") from e
        self.stdout.write(table)  # the same table as the framework-free `distlock list`

    def _force_release(self, name: str | None, token: int | None) -> None:
        if name is None or token is None:
            raise CommandError("--force-release NAME needs --token N, the holder's fencing token as the list shows it")
        client = get_client()
        names = spellings(name)
        holders = []
        try:
            for candidate in names:
                if client.force_release(candidate, token):
                    self.stdout.write(f"released lock {candidate!r} at token {token}")
                    return
                now = client.holder(candidate)
                holder = "nobody holds it" if now is None else f"its holder's token is {now.token} (owner {now.owner})"
                holders.append(holder + (f" under the name {candidate!r}" if len(names) > 1 else ""))
        except distlock.DistlockError as e:
            raise CommandError(f"cannot force-release lock {name!r}: {e}") from e
        raise CommandError(f"lock {name!r} was not released: {'; '.join(holders)}, not {token}; nothing changed")
