"""A holder whose body writes in a loop under ``stop_on_lost=True``, for tests/contract/test_stop_on_lost.py.

Run as ``python stopworker.py URL NAME TTL sync|async FILE``: takes the lock, prints ``{"token": T}``, then appends
``write <time> <i>`` lines to FILE every 10 ms in its body (the main thread's, or an asyncio task's); once the body was
stopped by ``LockLost``, ``lost <time>`` (when ``on_lost`` fired) and ``stopped <time>`` (when the body stopped). Times
are ``time.monotonic()``, each taken at once. ``on_lost`` runs on the keeper's clean-up thread beside the stop, so it
may fire a moment after the body stopped: the lines are written by the main thread after both, in this order. Exits 0
after a stop, 1 if the body ended otherwise or ``on_lost`` never fired.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import distlock


def main() -> int:
    url, name, ttl, mode, path = sys.argv[1:]
    out = open(path, "a", buffering=1)  # noqa: SIM115 - one line buffered file for the whole run
    lost_at: list[float] = []
    lost = threading.Event()

    def on_lost(lock: distlock.Lock) -> None:
        lost_at.append(time.monotonic())  # taken at once; written after the stop, with the other lines
        lost.set()

    client = distlock.connect(url)
    options: distlock.LockOptions = {"ttl": float(ttl), "stop_on_lost": True, "on_lost": on_lost}
    try:
        if mode == "sync":
            with client.lock(name, **options) as lock:
                print(json.dumps({"token": lock.token}), flush=True)
                for i in range(100_000):
                    out.write(f"write {time.monotonic()} {i}\n")
                    time.sleep(0.01)
        else:

            async def body() -> None:
                async with client.async_lock(name, **options) as lock:
                    print(json.dumps({"token": lock.token}), flush=True)
                    for i in range(100_000):
                        out.write(f"write {time.monotonic()} {i}\n")
                        await asyncio.sleep(0.01)

            asyncio.run(body())
    except distlock.LockLost:
        stopped_at = time.monotonic()
        if not lost.wait(10):
            return 1
        out.write(f"lost {lost_at[0]}\nstopped {stopped_at}\n")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
