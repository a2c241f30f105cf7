"""A process that takes a semaphore slot (or a read/write lock's read or write side) again and again until a stop
file appears, and logs what it did to a shared SQLite database, for the multi-process tests of those primitives.

Run as ``python slotworker.py URL DB NAME KIND TTL`` (KIND: ``s<limit>``, ``r`` or ``w``). Each hold logs ``enter``
and ``exit`` with its token and the system-wide monotonic clock, both inside the hold. A writer or semaphore slot
makes one fenced read-modify-write of the shared counter row on the way: a claim-and-read transaction (``fence <=
token``, logging ``enter``), a short pause, then a write transaction that lands only if the row still carries
exactly this token (logging ``exit``); a write that lands is acknowledged in that transaction (table ``acks``). A
reader only logs. The worker stops when ``<DB>.stop`` exists.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time

import distlock

#: How long a hold works between its read and its write: long enough for the limit's holders to overlap even when
#: a freed slot is found only by a waiter's next poll (every 0.05 s on MariaDB and SQLite) on a loaded machine (at
#: 0.005 s, a CI run with three suites on two cores saw SQLite's lock table never reach three holders at once).
HOLD = 0.02


def _db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 60000")
    db.execute("PRAGMA synchronous = OFF")  # a log for one test run: short write transactions, not durability
    return db


def setup(path: str) -> None:
    db = _db(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE events (pid INTEGER, token INTEGER, what TEXT, at REAL)")
    db.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER, fence INTEGER)")
    db.execute("CREATE TABLE acks (token INTEGER, value INTEGER)")
    db.execute("INSERT INTO counter VALUES (1, 0, 0)")
    db.close()


def log(db: sqlite3.Connection, token: int, what: str) -> None:
    db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (os.getpid(), token, what, time.monotonic()))


def fenced_increment(db: sqlite3.Connection, token: int) -> None:
    """The claim and read, then the write, each with its own log line in the same transaction (``enter`` is logged
    with the claim, ``exit`` with the write)."""
    db.execute("BEGIN IMMEDIATE")
    log(db, token, "enter")
    claimed = db.execute("UPDATE counter SET fence = ? WHERE id = 1 AND fence <= ?", (token, token)).rowcount
    value = db.execute("SELECT value FROM counter WHERE id = 1").fetchone()[0]
    db.execute("COMMIT")
    time.sleep(HOLD)  # the work between the read and the write, outside any transaction: holders overlap here
    db.execute("BEGIN IMMEDIATE")
    # Refused unless the row still carries exactly our token (a newer holder claimed it: refused too).
    if claimed and db.execute("UPDATE counter SET value = ? WHERE id = 1 AND fence = ?", (value + 1, token)).rowcount:
        db.execute("INSERT INTO acks VALUES (?, ?)", (token, value + 1))
    log(db, token, "exit")
    db.execute("COMMIT")


def main() -> None:
    url, path, name, kind, ttl = sys.argv[1:6]
    client = distlock.connect(url)
    db = _db(path)
    while not os.path.exists(path + ".stop"):
        if kind.startswith("s"):
            handle = client.semaphore(name, limit=int(kind[1:]), ttl=float(ttl), timeout=5)
        else:
            rw = client.rwlock(name, ttl=float(ttl), timeout=5)
            handle = rw.read() if kind == "r" else rw.write()
        if not handle.acquire():
            continue
        token = handle.token
        if kind != "r":
            fenced_increment(db, token)
        else:  # readers hold together: they read, and leave the fenced writes to writers
            log(db, token, "enter")
            time.sleep(HOLD)
            log(db, token, "exit")
        with contextlib.suppress(distlock.LockLost):
            handle.release()
    client.close()


if __name__ == "__main__":
    main()
