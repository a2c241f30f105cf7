"""A lock holder in a separate process, driven line by line over stdin/stdout (JSON), for signal tests.

Run as ``python lockworker.py URL``. Commands (one JSON object a line) and answers:

- ``{"op": "acquire", "name": N, "ttl": S, "timeout": S}`` → ``{"acquired": bool, "token": int|null}`` (with
  ``"limit": L``: a slot of semaphore N of limit L)
- ``{"op": "status"}`` → ``{"owned": bool, "lost": bool}``
- ``{"op": "ensure_held"}`` / ``{"op": "release"}`` → ``{"ok": true}`` or ``{"error": "LockLost", "message": ...}``
- ``{"op": "exit"}``

The worker prints ``{"ready": pid}`` first. Each answer is flushed at once, so a test can SIGSTOP it between lines.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import distlock


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
