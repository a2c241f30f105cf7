"""A process that holds a lock and reads and writes one ``Counter`` row, driven over stdin/stdout, for SIGSTOP tests.

Run as ``python sqlaworker.py LOCK_URL DB_URL [SESSION]``: SESSION ``default`` (SQLAlchemy's, ``expire_on_commit=True``:
what a user's session is) or ``kept`` (``expire_on_commit=False``, the default here); it prints ``{"ready": true}``,
then answers one JSON line per command (flushed at once, so a test can SIGSTOP it between two):

- ``{"op": "acquire", "name": N, "ttl": S}`` → ``{"token": T}``
- ``{"op": "elect", "name": N, "value": V, "ttl": S}`` → ``{"token": T}``: campaign in election N as candidate V
  until leading; the term is the token, and the election's lock is the lock of the commands below
- ``{"op": "read", "id": I, "claim": bool, "commit": bool}`` → ``{"value": V, "token": T}``: read the row, claiming
  it first (``claim_one``) or not; commit right after (the autocommit path) or keep the transaction open.
- ``{"op": "write", "guard": "flush"|"write-only", "commit": bool}`` → ``{"ok": true}``: write what was read + 1,
  by an ORM flush, or by a bare conditional ``UPDATE ... WHERE fence_token <= :t`` (``fenced_update``): the
  write-only guard (docs/architecture.md, claim on read).
- ``{"op": "commit"}``, ``{"op": "release"}`` → ``{"ok": true}``
- ``{"op": "increments", "id": I, "count": N, "ttl": S}`` → ``{"done": N}``: N times, lock the row, claim it, add 1
  and commit.

Any failure answers ``{"error": <exception class>, "message": ...}`` (the session is then rolled back).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqla.models import Counter, make_engine
from sqlalchemy.orm import Session

import distlock
from distlock_sqla import claim_one, fenced_update


class Worker:
    def __init__(self, lock_url: str, db_url: str, session: str = "kept") -> None:
        self.client = distlock.connect(lock_url)
        self.engine = make_engine(db_url)
        self.session = Session(self.engine, expire_on_commit=session == "default")
        self.lock: distlock.Lock | None = None
        self.row: Counter | None = None
        self.read_value = 0

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "acquire":
            self.lock = self.client.lock(command["name"], ttl=command["ttl"], timeout=60)
            self.lock.acquire()
            return {"token": self.lock.token}
        if op == "elect":
            election = self.client.election(command["name"], value=command["value"], ttl=command["ttl"], timeout=60)
            election.campaign()
            self.lock = election.lock
            return {"token": election.term}
        if op == "read":
            if command["claim"]:
                self.row = claim_one(self.session, Counter, command["id"])
            else:
                self.row = self.session.get(Counter, command["id"])
            assert self.row is not None
            self.read_value = self.row.value
            if command["commit"]:
                self.session.commit()
            return {"value": self.row.value, "token": self.row.fence_token}
        if op == "write":
            assert self.row is not None
            if command["guard"] == "flush":
                self.row.value = self.read_value + 1
                self.session.flush()
            else:
                fenced_update(self.session, Counter, {"value": self.read_value + 1}, Counter.id == self.row.id)
            if command["commit"]:
                self.session.commit()
            return {"ok": True}
        if op == "commit":
            self.session.commit()
            return {"ok": True}
        if op == "release":
            assert self.lock is not None
            self.lock.release()
            return {"ok": True}
        if op == "increments":
            lock = self.client.lock(f"counter:{command['id']}", ttl=command["ttl"], timeout=120)
            for _ in range(command["count"]):
                with lock:
                    claim_one(self.session, Counter, command["id"]).value += 1
                    self.session.commit()
            return {"done": command["count"]}
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    worker = Worker(*sys.argv[1:4])
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command: dict[str, Any] = json.loads(line)
        if command["op"] == "exit":
            break
        try:
            answer = worker.handle(command)
        except Exception as e:
            worker.session.rollback()
            answer = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(answer), flush=True)
    worker.session.close()
    worker.engine.dispose()
    worker.client.close()


if __name__ == "__main__":
    main()
