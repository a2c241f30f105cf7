"""A lock holder in a separate process, driven line by line over stdin/stdout (JSON), for signal tests.

Run as ``python lockworker.py URL``. Commands (one JSON object a line) and answers:

- ``{"op": "acquire", "name": N, "ttl": S, "timeout": S}`` → ``{"acquired": bool, "token": int|null}`` (with
  ``"limit": L``: a slot of semaphore N of limit L)
- ``{"op": "status"}`` → ``{"owned": bool, "lost": bool}``
- ``{"op": "ensure_held"}`` / ``{"op": "release"}`` → ``{"ok": true}`` or ``{"error": "LockLost", "message": ...}``
- ``{"op": "fenced_write", "db": SQLALCHEMY_URL, "table": T, "row": ID, "value": V}`` → ``{"rows": n}``: the
  holder's fenced write in plain SQL, ``UPDATE T SET value = V, fence_token = <token> WHERE id = ID AND fence_token
  <= <token>`` (0 rows: refused)
- ``{"op": "clock"}`` → ``{"time": time.time()}``: the worker's own clock (under faketime, not the test's)
- ``{"op": "exit"}``

The worker prints ``{"ready": pid}`` first. Each answer is flushed at once, so a test can SIGSTOP it between lines.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import distlock


def fenced_write(command: dict[str, Any], token: int) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(command["db"])
    try:
        with engine.begin() as connection:
            table = sa.table(command["table"], sa.column("id"), sa.column("value"), sa.column("fence_token"))
            update = (
                sa.update(table)
                .where(table.c.id == command["row"], table.c.fence_token <= token)
                .values(value=command["value"], fence_token=token)
            )
            return int(connection.execute(update).rowcount)
    finally:
        engine.dispose()


def main() -> None:
    client = distlock.connect(sys.argv[1])
    lock: distlock.Lock | None = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command: dict[str, Any] = json.loads(line)
        op = command["op"]
        answer: dict[str, Any]
        try:
            if op == "acquire":
                options: distlock.LockOptions = {"ttl": command["ttl"], "timeout": command.get("timeout", 60)}
                limit = command.get("limit")
                lock = (
                    client.lock(command["name"], **options)
                    if limit is None
                    else client.semaphore(command["name"], limit, **options)
                )
                acquired = lock.acquire()
                answer = {"acquired": acquired, "token": lock.token if acquired else None}
            elif op == "status":
                assert lock is not None
                answer = {"owned": lock.owned(), "lost": lock.lost}
            elif op == "ensure_held":
                assert lock is not None
                lock.ensure_held()
                answer = {"ok": True}
            elif op == "release":
                assert lock is not None
                lock.release()
                answer = {"ok": True}
            elif op == "fenced_write":
                assert lock is not None
                answer = {"rows": fenced_write(command, lock.token)}
            elif op == "clock":
                answer = {"time": time.time()}
            elif op == "exit":
                break
            else:
                answer = {"error": "UnknownCommand", "message": op}
        except distlock.DistlockError as e:
            answer = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(answer), flush=True)
    client.close()


if __name__ == "__main__":
    main()
