"""``manage.py accrue_interest PK``: credit interest to one account — a batch job writing under the account's lock.

It takes the lock ``account:{pk}``, claims and reads the row (``.fenced()``), computes the interest, and saves with
the lock's fencing token. The demo runs it with ``--hold-before-write`` and freezes it (SIGSTOP) between the read
and the write, longer than its lease (``--ttl``): meanwhile requests take the lock with newer tokens and change the
balance; when the job is resumed its save is refused (``StaleFenceToken``), so the interest it computed from an old
balance is never written over theirs. ``--no-fence`` shows what happens without the fence: a plain read and a plain
``UPDATE``, which silently overwrites the newer writes (a lost update).

Output: one line per step (JSON lines with ``--json``): ``read``, then ``written`` or ``refused``. Exit code 0 when
written, 3 when refused. What can go wrong: the lock cannot be acquired within ``--timeout``, or the lock service is
unreachable: an error naming it, exit code 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

import distlock
from distlock_django import distributed_lock

from ...models import Account, Movement

REFUSED = 3


class Command(BaseCommand):
    help = "Credit interest to one account under its lock, with a fenced write."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("account", type=int, help="the account's id")
        parser.add_argument("--percent", type=float, default=1.0, help="interest in percent (default 1)")
        parser.add_argument("--ttl", type=float, default=10.0, help="lease of the lock, seconds (default 10)")
        parser.add_argument("--timeout", type=float, default=30.0, help="how long to wait for the lock (default 30)")
        parser.add_argument(
            "--hold-before-write",
            action="store_true",
            help="after the read, wait for a line on stdin before writing (the demo freezes the job there)",
        )
        parser.add_argument("--no-fence", action="store_true", help="read and write without the fence (lost updates!)")
        parser.add_argument("--json", action="store_true", help="print JSON lines")

    def _say(self, options: dict[str, Any], event: str, text: str, **data: Any) -> None:
        if options["json"]:
            self.stdout.write(json.dumps({"event": event, **data}))
        else:
            self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args: Any, **options: Any) -> None:
        pk = options["account"]
        try:
            with distributed_lock(f"account:{pk}", ttl=options["ttl"], timeout=options["timeout"]) as lock:
                if options["no_fence"]:
                    account = Account.objects.get(pk=pk)
                else:
                    account = Account.objects.filter(pk=pk).fenced().get()  # claim, then read
                interest = account.balance * options["percent"] // 100
                self._say(
                    options,
                    "read",
                    f"token {lock.token}: account {pk} has {account.balance}; interest {interest:.0f}",
                    token=lock.token,
                    balance=account.balance,
                )
                if options["hold_before_write"]:
                    sys.stdin.readline()
                lost = lock.lost
                amount = int(interest)
                with transaction.atomic():
                    account.balance += amount
                    if options["no_fence"]:
                        Account.objects.filter(pk=pk).update(balance=account.balance)
                    else:
                        account.save()  # fenced: refused if a newer holder claimed the row
                    Movement.objects.create(
                        account=account,
                        kind=Movement.Kind.INTEREST,
                        amount=amount,
                        balance_after=account.balance,
                        fence_token=lock.token,
                    )
                self._say(
                    options,
                    "written",
                    f"token {lock.token}: wrote balance {account.balance} (lock lost meanwhile: {lost})",
                    token=lock.token,
                    amount=amount,
                    balance=account.balance,
                    lost=lost,
                )
        except distlock.StaleFenceToken as e:
            self._say(options, "refused", f"refused: {e}", token=e.token, current=e.current, error=str(e))
            sys.exit(REFUSED)
        except distlock.LockLost as e:
            # The write went through (nobody newer had touched the row), but the release found the lease gone.
            self._say(options, "lost", f"lock lost before release: {e}", error=str(e))
        except distlock.DistlockError as e:
            raise CommandError(f"{type(e).__name__}: {e}") from e
