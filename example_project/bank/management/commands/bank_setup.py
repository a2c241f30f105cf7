"""``manage.py bank_setup``: create the tables, the opening accounts and a staff user for the admin.

Run once on an empty database (the demo does, in its temp dir). What can go wrong: accounts exist already — the
command says so and changes nothing (``--accounts 0`` only migrates and sets the staff user).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction

from ...models import Account, Movement

OWNERS = ("Ada", "Grace", "Edsger", "Barbara", "Leslie", "Tony", "Radia", "Ken")


class Command(BaseCommand):
    help = "Create the tables, opening accounts and a staff user of the example bank."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--accounts", type=int, default=4, help="how many accounts to open (default 4)")
        parser.add_argument("--balance", type=int, default=100_000, help="opening balance of each (default 100000)")
        parser.add_argument("--staff", default="admin", help="username of a staff superuser (default admin)")
        parser.add_argument("--password", default=None, help="its password (default: no staff user is made)")

    def handle(self, *args: Any, **options: Any) -> None:
        count, balance = options["accounts"], options["balance"]
        if count < 0 or balance < 0:
            raise CommandError("--accounts and --balance must be >= 0")
        with connection.cursor() as cursor:  # readers never wait for the writer; it stays set in the file
            cursor.execute("PRAGMA journal_mode=WAL")
        call_command("migrate", verbosity=0, interactive=False)
        if count:
            if Account.objects.exists():
                raise CommandError("accounts exist already; bank_setup opens accounts on an empty database only")
            with transaction.atomic():
                for i in range(count):
                    owner = OWNERS[i % len(OWNERS)] + ("" if i < len(OWNERS) else f" {i // len(OWNERS) + 1}")
                    account = Account.objects.create(owner=owner, balance=balance)
                    Movement.objects.create(
                        account=account,
                        kind=Movement.Kind.OPENING,
                        amount=balance,
                        balance_after=balance,
                        fence_token=0,
                    )
        if options["password"]:
            user, _ = User.objects.get_or_create(username=options["staff"])
            user.is_staff = user.is_superuser = True
            user.set_password(options["password"])
            user.save()
        self.stdout.write(f"bank ready: {Account.objects.count()} accounts")
