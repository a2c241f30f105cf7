"""The ZooKeeper backend: the primitives of ``_protocol.Backend`` over ZooKeeper, through kazoo.

ZooKeeper's own lock recipe, with a fencing token: a lease is a session (``_sessions``); a join is an EPHEMERAL
SEQUENTIAL node ``/<chroot>/<prefix>/<escaped name>/<nonce>-<lease hex>-<sequence>`` on its lease's session, the
lowest sequence holds, and its creation zxid (``czxid``) is the token. A waiter watches only the node it waits on
(the one ahead; a reader's newest writer ahead), a semaphore waiter the list of children; the grant rule is
``_shape``'s. The lock's own node is a CONTAINER that a join makes when missing; every delete of an entry also
deletes it when left empty (a revoke, those of the closed session's entries), and the server reclaims one a dead
session left: nothing stays per name. Sequence numbers start again with each new lock node: they order one queue,
the zxid every holder of a name. A lock's record is the data of the lock's own node, set in one multi-op with a
check of the writer's node, and pinned by an empty child. Releases are version-checked deletes of the ticket's own
path; a retried join first looks for its nonce and lease, so it never queues twice, and ``discard`` removes a node a
late copy made. Marks live beside the locks' nodes, in time buckets swept by their writers (``_marks``). How it maps
onto ZooKeeper: docs/operations/zookeeper.md.

What can go wrong: servers down or between leaders (retried until ``request_timeout``, then ``BackendUnavailable``);
a session the ensemble expired (``LeaseGone`` for a join on it; ``keep_alive`` reports it gone and the core declares
its locks lost); an ACL that refuses us (``AuthenticationFailed``); a join onto another kind (``LockKindMismatch``,
its node deleted at once); a name ZooKeeper refuses as a path component (``BackendError``). Inspectors show time
left only for this client's own sessions: ZooKeeper does not tell one session another's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ... import _clock
from ..._errors import BackendError, BackendUnavailable, ClientClosed, ConfigurationError, LockKindMismatch
from ..._names import escape_name, unescape_name
from ..._protocol import (
    Head,
    Holder,
    Interrupt,
    Lease,
    LeaseGone,
    LockState,
    Position,
    Ticket,
    Waiter,
    owner_id,
    unreachable,
)
from ..._retry import Attempt
from ..._shape import holding, kind_of, lock_state, refuse_mixed, waiting, waits_on

try:
    from kazoo import exceptions as kz
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the ZooKeeper backend needs the 'zookeeper' extra: pip install 'distlock-fenced[zookeeper]' (kazoo)"
    ) from _e

from ._marks import MARKS_ROOT, Marks
from ._sessions import RECORD_PIN, Sessions, queue_order, sequence

__all__ = ["ZooKeeperBackend"]


@dataclasses.dataclass(frozen=True)
class SemaphorePosition(Position):
    """A semaphore waiter's position: the entries ahead of it when read. No single entry's deletion is needed for it
    to hold (any ``limit`` of them will do), so it watches the queue's list of children instead of one node."""

    queue_ahead: tuple[str, ...] = ()


def _position_in(parent: str, queue: Sequence[str], index: int) -> Position:
    """Where the entry at ``index`` of ``queue`` (in queue order) stands, by the grant rule of its kind: held, or
    the one node whose deletion it must wait for (a plain lock's or a writer's: the entry just ahead; a reader's: the
    newest writer ahead), or, for a semaphore, the entries ahead of it to watch as a whole."""
    kinds = [kind_of(child) for child in queue[: index + 1]]
    if holding(kinds)[-1]:
        return Position(held=True, waiters_ahead=index)
    ahead = waits_on(kinds)
    if ahead is None:
        return SemaphorePosition(held=False, waiters_ahead=index, queue_ahead=tuple(queue[:index]))
    return Position(held=False, ahead=f"{parent}/{queue[ahead]}".encode(), waiters_ahead=index)


def _entry_prefix(nonce: str, lease_id: int) -> str:
    """What the name of a join's node starts with: ``<nonce>-<lease hex>-`` (ZooKeeper appends the sequence).

    A nonce is a seat, reused by every session and by the next join of the same seat (``Keeper.join_started``),
    and the sequence starts again at 0 in a lock node made again after its removal: without the lease, a path could
    name a node of another session in a later life of the lock node, and a retried version-checked delete (every
    entry has version 0) would remove it. With it, a path is reused only by its own session's next join of the
    seat, which starts after that seat's delete is known done.
    """
    return f"{nonce}-{lease_id:x}-"


@contextlib.contextmanager
def _woken_by_change(client: KazooClient, interrupt: Interrupt) -> Iterator[threading.Event]:
    """An event set by a change of ``client``'s connection state or by ``interrupt``; a watch set with
    ``on_change(event)`` sets it too. Whoever waits on it reads again after: the event says only "look again"."""
    woken = threading.Event()

    def on_state(state: str) -> bool:
        woken.set()
        return True

    client.add_listener(on_state)
    unregister = interrupt.on_fire(woken.set)
    try:
        yield woken
    finally:
        unregister()
        client.remove_listener(on_state)


def _on_change(woken: threading.Event) -> Callable[[Any], None]:
    """A kazoo watch that sets ``woken``."""
    return lambda event: woken.set()


class ZooKeeperBackend:
    """Lock primitives on one ZooKeeper ensemble. Thread-safe; opens new sessions lazily after ``fork()``."""

    unsupported: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        prefix: str,
        chroot: str = "",
        connect_timeout: float = 5.0,
        request_timeout: float = 5.0,
    ) -> None:
        # The URL's grammar (``_url.parse``) checked the hosts and the path's components.
        base = "/".join(part for part in (chroot.strip("/"), prefix) if part)
        self._root = "/" + base
        self._sessions = Sessions(hosts, connect_timeout=connect_timeout, request_timeout=request_timeout)
        self.description = self._sessions.description
        self._marks = Marks(self._sessions, self._root)

    def after_fork(self) -> None:
        self._sessions.after_fork()

    def close(self) -> None:
        self._sessions.close()

    def _lock_path(self, name: str) -> str:
        escaped = escape_name(name)
        if escaped in (".", ".."):  # not a valid path component; "%2E" never comes out of escape_name
            escaped = escaped.replace(".", "%2E")
        return f"{self._root}/{escaped}"

    def _lock_nodes(self, client: KazooClient, what: str) -> list[str]:
        """The escaped names of every lock under this prefix (empty ones too; not the marks' node beside them)."""

        def request(each: Attempt) -> list[str]:
            try:
                return list(self._sessions.answer(client.get_children_async(self._root), each, client))
            except kz.NoNodeError:
                return []

        names, _ = self._sessions.call(what, request)
        return [name for name in names if name != MARKS_ROOT]

    def check(self) -> None:
        # A session of its own, closed again: a client that only takes locks then keeps one connection per lease,
        # not one more (ZooKeeper allows 60 connections per client address by default, maxClientCnxns). The
        # backend's own session is opened again when an inspector or operator first needs it.
        sessions = self._sessions
        try:
            client = sessions.open(max(sessions.request_timeout, 10.0), _clock.now() + sessions.connect_timeout)
            try:
                sessions.call(
                    "connect",
                    lambda each: sessions.answer(client.exists_async(self._root), each, client),
                    sessions.connect_timeout,
                )
            finally:
                sessions.close_within([client], sessions.request_timeout)
        except BackendUnavailable as e:
            hint = f"is ZooKeeper running there? ({e})"
            raise BackendUnavailable(unreachable(self.description, sessions.connect_timeout, hint)) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        return self._sessions.open_lease(ttl)

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        lease_id = lease.id
        try:
            client = self._sessions.of_lease(lease_id)
        except LeaseGone:
            return 0.0

        def request(each: Attempt) -> float:
            # Any answer renews the session for its whole timeout.
            self._sessions.answer(client.exists_async("/"), each, client)
            if self._sessions.replaced(client, lease_id):
                raise LeaseGone(f"lease {lease_id:x} is gone")
            return float(client._session_timeout) / 1000.0

        try:
            ttl, _ = self._sessions.call("lease keep-alive", request, min(timeout, self._sessions.request_timeout))
        except LeaseGone:
            return 0.0
        return ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        closed = self._sessions.close_lease(lease.id)  # closing our own session deletes its nodes
        if closed is None:
            # Another client's session (an operator's revoke): only its owner can close it, so delete its nodes
            # (and each lock's node left empty, as every delete of an entry does).
            self._delete_nodes_of(lease.id)
        elif closed and tickets:
            # The closed session's entries are gone; their locks' nodes left empty go too. A session closed while
            # cut off keeps its entries until it expires: the server's container check removes those lock nodes,
            # as it does when this fails (the session's close was what mattered).
            lock_nodes = sorted({ticket.key.decode("utf-8").rpartition("/")[0] for ticket in tickets})
            with contextlib.suppress(BackendError, ClientClosed):
                self._sessions.prune(self._sessions.main(), lock_nodes, f"revoke lease {lease.id:x}")

    def _delete_nodes_of(self, lease_id: int) -> None:
        """Delete every waiter's node under this prefix that lives on session ``lease_id`` (one read per lock)."""
        client = self._sessions.main()
        what = f"revoke lease {lease_id:x}"

        for escaped in self._lock_nodes(client, what):
            parent = f"{self._root}/{escaped}"
            for child in self._sessions.children(client, parent, what):
                stat = self._sessions.stat(client, f"{parent}/{child}", what)
                if stat is not None and int(stat.ephemeralOwner) == lease_id:
                    self._sessions.delete(client, f"{parent}/{child}", what)

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        client = self._sessions.of_lease(lease_id)
        parent = self._lock_path(name)
        what = f"enqueue for lock {name!r}"
        entry = _entry_prefix(nonce, lease_id)

        def request(each: Attempt) -> tuple[str, Any]:
            if each.number > 1:
                # The earlier attempt may have made our node: take it rather than make a second one (its name starts
                # with our entry's prefix; ``_entry_prefix`` says why the lease is in it, the owner check is kazoo's
                # session replacement below).
                try:
                    children = self._sessions.answer(client.get_children_async(parent), each, client)
                except kz.NoNodeError:
                    children = []
                for child in children:
                    if child.startswith(entry) and sequence(child) >= 0:
                        stat = self._sessions.answer(client.exists_async(f"{parent}/{child}"), each, client)
                        if stat is not None and int(stat.ephemeralOwner) == lease_id:
                            return f"{parent}/{child}", stat
            return self._sessions.join(client, parent, entry, owner, each)

        (path, stat), attempts = self._sessions.call(what, request)
        if int(stat.ephemeralOwner) != lease_id:
            # kazoo replaced an expired session between our check and the create: the node is not on our lease.
            self._sessions.delete(client, path, what)
            raise LeaseGone(f"{what}: lease {lease_id:x} (a ZooKeeper session) expired on {self.description}")
        ticket = Ticket(
            name=name, key=path.encode("utf-8"), token=int(stat.czxid), lease_id=lease_id, resent=attempts > 1
        )
        ours = kind_of(nonce)
        parent, _, mine = path.rpartition("/")
        queue = self._sessions.on_reader(ticket, lambda client: self._sessions.children(client, parent, what))
        try:
            refuse_mixed(name, ours, (kind_of(child) for child in queue if child != mine))
        except LockKindMismatch:
            self._sessions.delete(client, path, what)  # leave at once: nobody may count or pass a refused entry
            raise
        if mine not in queue:
            return ticket, Position(held=False, gone=True)
        return ticket, _position_in(parent, queue, queue.index(mine))

    def position(self, ticket: Ticket) -> Position:
        path = ticket.key.decode("utf-8")
        parent, _, mine = path.rpartition("/")
        what = f"read queue of lock {ticket.name!r}"
        queue = self._sessions.on_reader(ticket, lambda client: self._sessions.children(client, parent, what))
        if mine not in queue:
            return Position(held=False, gone=True)
        return _position_in(parent, queue, queue.index(mine))

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        # A watch on the node ahead fires once, when it is deleted; a change of the connection's state wakes us too
        # (the caller reads its place again, and that read raises when the service stays away).
        client = self._sessions.reader(ticket)
        patience = self._sessions.request_timeout if timeout is None else min(timeout, self._sessions.request_timeout)
        with _woken_by_change(client, interrupt) as woken:
            try:
                if isinstance(position, SemaphorePosition):
                    # A semaphore waiter: any change to the queue may be the one that lets it hold. If the entries
                    # ahead changed since its read, a deletion may have come before the watch: look again now.
                    parent, _, mine = ticket.key.decode("utf-8").rpartition("/")
                    children = client.get_children_async(parent, watch=_on_change(woken)).get(timeout=patience)
                    queue = queue_order(children)
                    if mine not in queue or tuple(queue[: queue.index(mine)]) != position.queue_ahead:
                        return None
                else:
                    ahead = position.ahead.decode("utf-8")
                    stat = client.exists_async(ahead, watch=_on_change(woken)).get(timeout=patience)
                    if stat is None:
                        return None  # already gone
            except (kz.KazooException, KazooTimeoutError):
                return None  # the caller's next read retries, and raises if the service stays away
            woken.wait(timeout)
        return None

    def watch_head(self, name: str, seen: Ticket | None, timeout: float, interrupt: Interrupt) -> None:
        # A watch on the lock node's children fires at the next join or leave (the lock node's deletion too); with
        # no lock node, one on its existence fires when a join makes it. The caller read the head before this call,
        # and a watch reports only what comes after it is set: so it is set first, then the head is read again
        # (after a sync, as ``head`` does), and a head that is not ``seen`` returns at once. A change of the
        # connection's state wakes us too: the caller's next read raises when the service stays away.
        client = self._sessions.main()
        parent = self._lock_path(name)
        patience = min(timeout, self._sessions.request_timeout)
        with _woken_by_change(client, interrupt) as woken:
            try:
                try:
                    client.get_children_async(parent, watch=_on_change(woken)).get(timeout=patience)
                except kz.NoNodeError:
                    if client.exists_async(parent, watch=_on_change(woken)).get(timeout=patience) is not None:
                        return  # made meanwhile: look again
            except (kz.KazooException, KazooTimeoutError):
                return  # the caller's next read retries, and raises if the service stays away
            head = self.head(name)
            if (None if head is None else head.ticket.token) != (None if seen is None else seen.token):
                return
            woken.wait(timeout)

    def dequeue(self, ticket: Ticket) -> bool:
        what = f"release lock {ticket.name!r}"
        return self._sessions.on_reader(
            ticket, lambda client: self._sessions.delete(client, ticket.key.decode("utf-8"), what)
        )

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        # One multi-op: the ticket's node still exists (version 0: it is never written after it is made), the
        # lock's own node takes the value, and, the first time, gets the pin that keeps it once its queue is empty.
        # A session the ensemble expired has had its nodes deleted, so a holder frozen past its session timeout is
        # refused even before anyone else holds.
        what = f"write the record of lock {ticket.name!r}"

        lock_node = self._lock_path(ticket.name)
        pin = f"{lock_node}/{RECORD_PIN}"

        def request(client: KazooClient) -> bool:
            def attempt(each: Attempt) -> bool:
                # The holder is the only writer, and nothing of ours removes a pin: one made is there to stay.
                pinned = self._sessions.answer(client.exists_async(pin), each, client) is not None
                transaction = client.transaction()
                transaction.check(ticket.key.decode("utf-8"), 0)
                transaction.set_data(lock_node, value)
                if not pinned:
                    transaction.create(pin)
                results = self._sessions.answer(transaction.commit_async(), each, client)
                return not any(isinstance(result, Exception) for result in results)

            written, _ = self._sessions.call(what, attempt)
            return written

        return self._sessions.on_reader(ticket, request)

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        # The check of write_record, in the mark's multi-op; the layout, expiry and sweep: ``_marks``.
        return self._sessions.on_reader(ticket, lambda client: self._marks.write(client, ticket, key, value, ttl))

    def read_mark(self, name: str, key: str) -> bytes | None:
        return self._marks.read(name, key)

    def read_record(self, name: str) -> bytes | None:
        client = self._sessions.main()
        parent = self._lock_path(name)
        what = f"read the record of lock {name!r}"
        self._sessions.call(what, lambda each: self._sessions.answer(client.sync_async(parent), each, client))
        found = self._sessions.get(client, parent, what)
        return found[0] if found is not None and found[0] else None

    def _head(self, name: str) -> tuple[str, bytes, Any, int, int] | None:
        """The holder's node of ``name``: its path, data, stat, the number of entries that wait and the number
        that hold (several for a semaphore or readers)."""
        client = self._sessions.main()
        parent = self._lock_path(name)
        what = f"read holder of lock {name!r}"
        # A sync first: this session then sees every write the ensemble committed before it (another session's
        # release or join), as a linearizable read would.
        self._sessions.call(what, lambda each: self._sessions.answer(client.sync_async(parent), each, client))
        while True:
            queue = self._sessions.children(client, parent, what)
            if not queue:
                return None
            path = f"{parent}/{queue[0]}"
            found = self._sessions.get(client, path, what)
            if found is not None:
                waiters = waiting([kind_of(child) for child in queue])
                return path, found[0], found[1], waiters, len(queue) - waiters
            # The head left between the two reads: read the queue again.

    def head(self, name: str) -> Head | None:
        found = self._head(name)
        if found is None:
            return None
        path, data, stat, waiters, holders = found
        token, lease_id = int(stat.czxid), int(stat.ephemeralOwner)
        holder = Holder(
            name=name, token=token, lease_id=lease_id, owner=owner_id(data), waiters=waiters, holders=holders
        )
        return Head(Ticket(name=name, key=path.encode("utf-8"), token=token, lease_id=lease_id), holder)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        client = self._sessions.main()
        parent = self._lock_path(name)
        what = f"look for a late join of lock {name!r}"
        self._sessions.call(what, lambda each: self._sessions.answer(client.sync_async(parent), each, client))
        for child in self._sessions.children(client, parent, what):
            if child.startswith(_entry_prefix(nonce, lease.id)):
                stat = self._sessions.stat(client, f"{parent}/{child}", what)
                if stat is not None and int(stat.ephemeralOwner) == lease.id:
                    self._sessions.delete(client, f"{parent}/{child}", what)
                    return int(stat.czxid)
        return None

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One pipelined round: every exists request goes out before the first answer is awaited.
        if not tickets:
            return []
        lease_id = tickets[0].lease_id
        client = self._sessions.of_lease(lease_id)

        def request(each: Attempt) -> list[Ticket]:
            results = [client.exists_async(ticket.key.decode("utf-8")) for ticket in tickets]
            answers = [self._sessions.answer(result, each) for result in results]
            return [ticket for ticket, stat in zip(tickets, answers, strict=True) if stat is None]

        missing, _ = self._sessions.call("check held locks", request)
        if self._sessions.replaced(client, lease_id):
            raise LeaseGone(f"check held locks: lease {lease_id:x} is gone on {self.description}")
        return missing

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order."""
        client = self._sessions.main()
        what = "inspect locks"
        self._sessions.call(what, lambda each: self._sessions.answer(client.sync_async(self._root), each, client))
        states = []
        for escaped in self._lock_nodes(client, what):
            parent = f"{self._root}/{escaped}"
            waiters, kinds = [], []
            for child in self._sessions.children(client, parent, what):
                found = self._sessions.get(client, f"{parent}/{child}", what)
                if found is not None:
                    data, stat = found
                    kinds.append(kind_of(child))
                    waiters.append(
                        Waiter(
                            owner=owner_id(data),
                            token=int(stat.czxid),
                            lease_id=int(stat.ephemeralOwner),
                            ttl_left=self._sessions.ttl_left(int(stat.ephemeralOwner)),
                        )
                    )
            if waiters:
                states.append(lock_state(unescape_name(escaped), waiters, kinds))
        return sorted(states, key=lambda state: state.name)
