"""The Redis backend's Lua scripts: loaded from the package's ``lua/*.lua`` files, run by their SHA-1.

Each script is one file whose opening comment says its KEYS, its ARGV and what it answers. The queue scripts
(enqueue, position, remove, head, keep_alive) share ``lua/helpers.lua``, which is put in front of each of them here,
after one line that gives the helpers the constants they share with Python (:data:`LAST_MEMBER`, the layout mark
of ``_keys``, the wake-up lists' TTL on a queue of an earlier layout).
:meth:`Script.run` sends ``EVALSHA``; a server that has not cached the script (new, restarted, flushed) answers
``NOSCRIPT`` and gets ``EVAL`` with the source, which caches it.

What can go wrong: a script's errors are those of the request function it is run with (the backend's, which
retries and translates them); a ``.lua`` file missing from the install fails this module's import.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from typing import Any

import redis.exceptions

from ._keys import LAYOUT_MARK

__all__ = ["ENQUEUE", "HEAD", "KEEP_ALIVE", "LAST_MEMBER", "MISSING", "POSITION", "REMOVE", "WRITE_RECORD", "Script"]

#: The queue's last member, never a waiter (members are ``<lease hex>-<nonce>``): its score is the last token
#: handed out, so the queue is the token counter too. It sorts after a waiter of equal score (``~`` after hex digits).
LAST_MEMBER = "~token"
#: How long a wake-up waits in its list for a waiter that is not blocked yet (one that is later re-reads anyway),
#: when its queue has no expiry to share (a queue of an earlier layout): otherwise the list expires with the queue.
_WAKE_TTL_MS = 600_000

#: The backend's request function: ``(what, key, *command, again=...)`` -> (the answer, the attempts made).
Request = Callable[..., tuple[Any, int]]


class Script:
    """One Lua script: its source and the SHA-1 that ``EVALSHA`` names it by."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def run(
        self, request: Request, what: str, keys: tuple[str, ...], *args: Any, again: tuple[Any, ...] | None = None
    ) -> tuple[Any, int]:
        """Run the script on the server of ``keys[0]`` through ``request``; ``again``, when given, are the arguments
        of every call after the first. Returns the answer and the attempts made."""
        head = (len(keys), *keys)
        retried = None if again is None else ("EVALSHA", self.sha, *head, *again)
        try:
            return request(what, keys[0], "EVALSHA", self.sha, *head, *args, again=retried)
        except redis.exceptions.NoScriptError:
            # Not cached (a new or restarted server): EVAL sends the source and caches it. An EVALSHA before it
            # may have been retried, so this is an "again" call.
            return request(what, keys[0], "EVAL", self.source, *head, *(args if again is None else again))


#: The package's ``lua`` folder, wherever it is installed (a wheel, a zip, a source tree).
_LUA_FILES = resources.files(__name__.rpartition(".")[0]) / "lua"


def _source(name: str) -> str:
    return (_LUA_FILES / f"{name}.lua").read_text(encoding="utf-8")


_HELPERS = f"local LAST, WAKE_TTL_MS, TAG = '{LAST_MEMBER}', {_WAKE_TTL_MS}, '{LAYOUT_MARK}'\n" + _source("helpers")


def _load(name: str, *, helpers: bool) -> Script:
    return Script((_HELPERS if helpers else "") + _source(name))


ENQUEUE = _load("enqueue", helpers=True)
POSITION = _load("position", helpers=True)
REMOVE = _load("remove", helpers=True)
HEAD = _load("head", helpers=True)
MISSING = _load("missing", helpers=False)
KEEP_ALIVE = _load("keep_alive", helpers=True)
WRITE_RECORD = _load("write_record", helpers=False)
