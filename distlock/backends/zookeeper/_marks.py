"""The ZooKeeper backend's marks (``Marking``), which expire with no TTL node and leave nothing behind.

ZooKeeper expires no node but its TTL nodes (``extendedTypesEnabled`` on every server), so a mark carries its own
expiry and is judged, read and swept on the ensemble's clock: the ``mtime`` of a node is the leader's time of the
write that set it. A mark is ``<prefix node>/%marks/t<bound>/<escaped name>%m<escaped key>`` (:data:`MARKS_ROOT`
is no escaped name: an escaped name has ``%`` only before two hex digits; ``%m`` likewise splits name from key),
its data ``<ttl ms>\\n<value>``: it expires at its ``mtime`` plus its TTL. Its parent is a *time bucket*, a CONTAINER
named by a bound past that expiry (rounded up to a width of a tenth of the TTL, at least a second); the marks root
is a CONTAINER too, so the server reclaims both once empty.

Every call first sets the marks root's data (empty): the answer's ``mtime`` is the server's time now, with no
client's clock in it. A write then looks for the key's copy in every bucket, and in one multi-op checks the
ticket's node (version 0: the check of ``write_record``), deletes a copy in another bucket and creates (or sets) the
mark in the bucket of its bound; then it sweeps: each bucket whose bound has passed loses every mark whose own expiry
has passed (a version-checked delete: a mark written again meanwhile stays), then goes itself unless a mark remains.
A read takes the newest copy (``mzxid``) and says None once it expired. Costs: a read is two round trips, a write
four (five when it sweeps); the marks root's buckets are a handful per TTL in use.

Races, and why each is harmless: a write whose bucket is deleted (swept, or reclaimed) before its multi-op lands
fails whole (``NoNodeError``) and is made again from a new time; a slow writer that lands a mark in a bucket whose
bound has passed is safe, as the sweep judges each mark by its own ``mtime`` and keeps a bucket that is not empty;
a retried write finds its own copy and writes it again. Two holders (a semaphore's) writing one key at the same
moment may each make a copy in a different bucket: a read takes the newer, but should it expire before the older, the
older shows again until it expires too. The ensemble's servers' clocks are assumed to agree (NTP) to well within a
TTL: a new leader's clock judges the marks an earlier one wrote. Readers need write access to the marks root.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient

from ..._errors import BackendError, ClientClosed
from ..._names import escape_name
from ..._protocol import Ticket
from ..._retry import Attempt
from ._sessions import Sessions

__all__ = ["MARKS_ROOT", "Marks"]

#: The marks' node under the prefix's node, beside the locks' nodes: no lock's escaped name (``%`` then no hex).
MARKS_ROOT = "%marks"

_BUCKET = "t"  # a bucket is ``t<bound in ms>``: no child of it ends ``-<digits>`` as a queue entry's name does


def _bound_of(bucket: str) -> int | None:
    """The time (server ms) past which no mark of ``bucket`` lives; None for a node that is no bucket."""
    number = bucket.removeprefix(_BUCKET)
    return int(number) if bucket.startswith(_BUCKET) and number.isdigit() else None


def _expiry(data: bytes, stat: Any) -> tuple[bytes, int]:
    """A mark's value and when it expires (server ms): its last write's ``mtime`` plus its TTL (a node that is no
    mark's, written by hand, counts as expired)."""
    ttl_ms, _, value = data.partition(b"\n")
    return value, int(stat.mtime) + (int(ttl_ms) if ttl_ms.isdigit() else 0)


class Marks:
    """The marks of the locks under one prefix's node ``prefix_node``, on ``sessions``' ensemble. Thread-safe."""

    def __init__(self, sessions: Sessions, prefix_node: str) -> None:
        self._sessions = sessions
        self._root = f"{prefix_node.rstrip('/')}/{MARKS_ROOT}"

    def _name(self, name: str, key: str) -> str:
        return f"{escape_name(name)}%m{escape_name(key)}"

    def _now_and_buckets(self, client: KazooClient, each: Attempt) -> tuple[int, list[str]] | None:
        """The server's time (ms) and the buckets, in one flight; None when there is no marks root."""
        touched, listed = client.set_async(self._root, b""), client.get_children_async(self._root)
        try:
            stat = self._sessions.answer(touched, each, client)
            buckets = self._sessions.answer(listed, each, client)
        except kz.NoNodeError:
            return None
        return int(stat.mtime), [bucket for bucket in buckets if _bound_of(bucket) is not None]

    def _copies(self, client: KazooClient, buckets: list[str], mark: str, each: Attempt) -> list[tuple[str, Any]]:
        """The buckets holding a copy of ``mark``, with its data and stat (one flight)."""
        results = [(bucket, client.get_async(f"{self._root}/{bucket}/{mark}")) for bucket in buckets]
        found = []
        for bucket, result in results:
            with contextlib.suppress(kz.NoNodeError):
                found.append((bucket, self._sessions.answer(result, each, client)))
        return found

    def read(self, name: str, key: str) -> bytes | None:
        client = self._sessions.main()
        mark = self._name(name, key)

        def attempt(each: Attempt) -> bytes | None:
            # The touch is a write: this session's reads after it see every mark written before it.
            found = self._now_and_buckets(client, each)
            if found is None:
                return None
            now, buckets = found
            copies = self._copies(client, buckets, mark, each)
            if not copies:
                return None
            _, (data, stat) = max(copies, key=lambda copy: int(copy[1][1].mzxid))
            value, expiry = _expiry(bytes(data), stat)
            return value if expiry > now else None

        value, _ = self._sessions.call(f"read mark {key!r} of lock {name!r}", attempt)
        return value

    def write(self, client: KazooClient, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        """Write the mark on ``client`` (the ticket's own session, or the backend's); False when the ticket's node
        is gone. Sweeps the buckets past their bound afterwards."""
        mark, ttl_ms = self._name(ticket.name, key), max(round(ttl * 1000), 1)
        width = max(ttl_ms // 10, 1000)
        data = b"%d\n" % ttl_ms + value

        def attempt(each: Attempt) -> tuple[bool, int, list[str]]:
            while True:
                if each.timeout <= 0:
                    raise kz.OperationTimeoutError(f"mark {mark} was raced until the deadline")
                found = self._now_and_buckets(client, each)
                if found is None:
                    self._make(client, self._root, each)
                    continue
                now, buckets = found
                # The write lands after ``now``, and its mark expires by ``now + ttl`` plus that delay: a width on.
                bucket = f"{_BUCKET}{-(-(now + ttl_ms) // width) * width + width}"
                copies = self._copies(client, buckets, mark, each)
                if bucket not in buckets:
                    self._make(client, f"{self._root}/{bucket}", each)
                transaction = client.transaction()
                transaction.check(ticket.key.decode("utf-8"), 0)
                for other, _ in copies:
                    if other != bucket:
                        transaction.delete(f"{self._root}/{other}/{mark}")
                if any(other == bucket for other, _ in copies):
                    transaction.set_data(f"{self._root}/{bucket}/{mark}", data)
                else:
                    transaction.create(f"{self._root}/{bucket}/{mark}", data)
                results = self._sessions.answer(transaction.commit_async(), each, client)
                if isinstance(results[0], (kz.NoNodeError, kz.BadVersionError)):
                    return False, now, buckets  # the ticket's node is gone: nothing was written
                if not any(isinstance(result, Exception) for result in results):
                    return True, now, buckets
                # A bucket swept or a copy moved meanwhile: nothing was written; look again.

        (written, now, buckets), _ = self._sessions.call(f"write mark {key!r} of lock {ticket.name!r}", attempt)
        if written:
            with contextlib.suppress(BackendError, ClientClosed):  # the mark is written; the next write sweeps again
                self._sweep(client, now, buckets)
        return written

    def _make(self, client: KazooClient, path: str, each: Attempt) -> None:
        """Make the CONTAINER ``path``: the marks root (and the prefix's node first, when missing), or a bucket (the
        marks root may be gone: the caller's next round finds it missing and makes it)."""
        try:
            self._sessions.answer(self._sessions.make_lock_node(client, path), each, client)
        except kz.NodeExistsError:
            pass
        except kz.NoNodeError:
            if path == self._root:
                self._sessions.answer(client.ensure_path_async(path.rpartition("/")[0]), each, client)

    def _sweep(self, client: KazooClient, now: int, buckets: list[str]) -> None:
        """Delete each bucket whose bound is past ``now`` with its expired marks (a bucket that keeps a mark stays)."""
        past = [f"{self._root}/{bucket}" for bucket in buckets if (_bound_of(bucket) or 0) <= now]

        def attempt(each: Attempt) -> None:
            for bucket in past:
                try:
                    children = self._sessions.answer(client.get_children_async(bucket), each, client)
                except kz.NoNodeError:
                    continue
                marks = [(f"{bucket}/{child}", client.get_async(f"{bucket}/{child}")) for child in children]
                deletes = []
                for path, result in marks:
                    try:
                        data, stat = self._sessions.answer(result, each, client)
                    except kz.NoNodeError:
                        continue
                    if _expiry(bytes(data), stat)[1] <= now:
                        deletes.append(client.delete_async(path, version=stat.version))
                deletes.append(client.delete_async(bucket))
                for result in deletes:
                    # Gone already, written again, or keeping a mark: the next sweep looks again.
                    with contextlib.suppress(kz.NoNodeError, kz.BadVersionError, kz.NotEmptyError):
                        self._sessions.answer(result, each, client)

        if past:
            self._sessions.call("sweep expired marks", attempt)
