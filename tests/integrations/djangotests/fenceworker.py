"""A Django process holding a lock on an account, driven over stdin/stdout (JSON lines), for SIGSTOP tests.

``{"op": "lock_and_read", "pk": N, "ttl": S, "claim": bool}`` → ``{"token": T, "balance": B}``: acquire the row's lock
and read it, claiming it first (``.fenced()``) or not (a plain read).
``{"op": "write", "guard": G}`` → ``{"ok": true}`` or ``{"error": "StaleFenceToken", ...}``: add 1 to what was read
and ``save()`` (``G`` "write-only": ``fenced_update()``, guarded by the lock's token alone).
``{"op": "lost"}`` → ``{"lost": bool}``: whether the lock taken by ``lock_and_read`` is known to be lost.
``lock_and_read`` waits up to ``"timeout"`` seconds (default 30) for the lock.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["DJANGO_SETTINGS_MODULE"] = "djangotests.testsettings"

import django

django.setup()

from djangotests.testapp.models import Account  # noqa: E402

import distlock  # noqa: E402
from distlock_django import get_client, lock_name  # noqa: E402


def main() -> None:
    account: Account | None = None
    lock: distlock.Lock | None = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command: dict[str, Any] = json.loads(line)
        answer: dict[str, Any]
        try:
            if command["op"] == "lock_and_read":
                lock = get_client().lock(
                    lock_name(f"account:{command['pk']}"), ttl=command["ttl"], timeout=command.get("timeout", 30)
                )
                lock.acquire()
                rows = Account.objects.filter(pk=command["pk"])
                account = (rows.fenced() if command["claim"] else rows).get()
                answer = {"token": lock.token, "balance": account.balance}
            elif command["op"] == "write":
                assert account is not None
                if command.get("guard") == "write-only":  # the lock's token alone guards the write
                    Account.objects.filter(pk=account.pk).fenced_update(balance=account.balance + 1)
                else:
                    account.balance += 1
                    account.save()
                answer = {"ok": True}
            elif command["op"] == "lost":
                assert lock is not None
                answer = {"lost": lock.lost}
            else:
                break
        except distlock.DistlockError as e:
            answer = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
