"""The ZooKeeper backend: the primitives of ``_protocol.Backend`` over ZooKeeper, through kazoo.

This is the queue ZooKeeper's own lock recipe describes, with a fencing token added. A lease is a ZooKeeper
*session*, and each lease gets a session (a ``KazooClient``) of its own: ZooKeeper ties an ephemeral node to the
session that made it and fixes the session's timeout when it is opened, so a client that holds locks on two TTLs
needs two sessions, and revoking one lease must close one session without touching the other. ``grant_lease(ttl)``
opens a session with ``ttl`` as its timeout and returns the session id and the timeout the server negotiated (the
server clamps it into its ``minSessionTimeout``..``maxSessionTimeout``, by default 2 to 20 ticks); kazoo pings the
session by itself, ``keep_alive`` makes one round trip on it and reports the lease gone once the session has
expired (kazoo then opens a new session on the same client: a different id, so the old lease never comes back),
and ``revoke_lease`` closes the session, which deletes its ephemeral nodes on the server at once (another client's
session, which only its owner can close, has its nodes under this prefix deleted one by one instead). One more session
(the backend's own, opened on first use) reads holders, lists locks and force-releases.

A waiter is an EPHEMERAL SEQUENTIAL node ``/<chroot>/<prefix>/<escaped name>/<nonce>-<sequence>`` made on its
lease's session; the lock's node is created on first use and stays. The node with the lowest sequence number holds
the lock; a waiter sets an ``exists`` watch on the node just ahead of it only, so a release wakes one waiter. The
fencing token is the holder node's creation zxid (``czxid``): ZooKeeper orders every write of the ensemble by zxid,
a node made later has a larger one, and the zxid keeps growing through leader elections (its high half is the
leader's epoch) and restarts (it is in the transaction log). Reads of one ticket's place go through its own
session, so a waiter always sees its own node (ZooKeeper promises a session its own writes, not another's).

Semaphores and read/write locks use the same queue under the grant rule of ``_shape``: the kind leads the nonce,
and so the node's name, where every reader of the queue sees it. A writer waits on the node just ahead, a reader on
the newest writer ahead of it; a semaphore waiter needs no one node in particular to go (any ``limit`` of those
ahead will do), so it sets a watch on the lock's list of children instead, and looks again at once when the entries
ahead already changed since its read. A join that finds another kind queued on the name leaves at once with
``LockKindMismatch``.

A lock's record (``write_record``) is the data of the lock's own node, set in one multi-op with a version check of
the writer's node (which fails when that node is gone).

Sequence numbers never repeat within a lock's node, so a path is never made twice and a release or cancel is a
delete of that path, version-checked (``delete(path, version=0)``: the node is never written after it is made) so
that no delete can remove anything but the node the ticket names; a force release reads the head's ``czxid`` first
and deletes only when it is still the token the operator saw. What ZooKeeper does not prevent is a *late join*: a
create whose connection broke before the answer may still have been applied, and kazoo cannot say. Like kazoo's own
``Lock`` (which puts a GUID in the node name for this), the node's name starts with the join's nonce: a retried
join first looks for a child of the lock with its nonce, and takes that node instead of making a second one; the
ticket is then marked ``resent``, and ``discard`` finds, by the same nonce, a node that a still later copy made
after the lock was done with it, so the keeper can remove it.

What can go wrong: servers may be down, restarting or between leaders, and a connection may break mid-request. kazoo
reconnects on its own (to any server in the URL) while the session lives; every request here waits at most until its
deadline (``request_timeout``) and is retried after a connection loss while time is left, then raises
``BackendUnavailable`` with kazoo's exception as ``__cause__``. A session the ensemble expired (the client was cut
off for longer than its timeout, or frozen) raises ``LeaseGone`` for a join on it and reads as gone in
``keep_alive``: the core then declares every lock on it lost, with the same signals as a lost etcd lease; a read or
release of a ticket whose session a revoke closed under it goes through the backend's own session instead. An ACL
that refuses us raises ``AuthenticationFailed``. The backend's own session may expire too (a long pause of the
process): kazoo opens the next one by itself, and a request that met the expiry is sent again on it. ZooKeeper does
not tell a client how long another client's session has left, so inspectors show time left only for this client's
own sessions (``ttl_left`` is None for others). A name ZooKeeper refuses as a path component (``.`` and ``..`` are
escaped; a few Unicode ranges, such as the private use area, are not accepted by the server) raises
``BackendError``. Every session is a TCP connection and two kazoo threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

from ... import _clock
from ..._errors import (
    AuthenticationFailed,
    BackendError,
    BackendUnavailable,
    ClientClosed,
    ConfigurationError,
    LockKindMismatch,
)
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
from ..._retry import Attempt, ErrorTable, retrying
from ..._shape import holding, kind_of, lock_state, refuse_mixed, waiting, waits_on

try:
    from kazoo import exceptions as kz
    from kazoo.client import KazooClient, KazooState
    from kazoo.handlers.threading import KazooTimeoutError
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the ZooKeeper backend needs the 'zookeeper' extra: pip install 'distlock-fenced[zookeeper]' (kazoo)"
    ) from _e

__all__ = ["ZooKeeperBackend"]

_R = TypeVar("_R")

#: The longest session timeout a client can ask for (the protocol's 32-bit milliseconds), in seconds.
_LONGEST_TIMEOUT = (2**31 - 1) / 1000

_RETRYABLE: tuple[type[Exception], ...] = (kz.ConnectionLoss, kz.OperationTimeoutError, KazooTimeoutError)


class _MainSessionRenewing(Exception):
    """The backend's own session (not a lease) expired under a request; kazoo opens a new one by itself."""


def _retryable(error: Exception) -> bool:
    return isinstance(error, (*_RETRYABLE, _MainSessionRenewing))


def _sequence(child: str) -> int:
    """The sequence number ZooKeeper appended to a waiter's node name (``<nonce>-0000000042`` -> 42)."""
    _, _, number = child.rpartition("-")
    return int(number) if number.isdigit() else -1


def _queue(children: Sequence[str]) -> list[str]:
    """A lock's waiters in queue order (the sequence numbers), anything else left out."""
    return sorted((child for child in children if _sequence(child) >= 0), key=_sequence)


@dataclasses.dataclass(frozen=True)
class _Place(Position):
    """A semaphore waiter's place: the entries ahead of it when read. No single entry's deletion is needed for it
    to hold (any ``limit`` of them will do), so it watches the queue's list of children instead of one node."""

    queue_ahead: tuple[str, ...] = ()


def _format_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _place_in(parent: str, queue: Sequence[str], index: int) -> Position:
    """Where the entry at ``index`` of ``queue`` (in queue order) stands, by the grant rule of its kind: held, or
    the one node whose deletion it must wait for (a plain lock's or a writer's: the entry just ahead; a reader's: the
    newest writer ahead), or, for a semaphore, the entries ahead of it to watch as a whole."""
    kinds = [kind_of(child) for child in queue[: index + 1]]
    if holding(kinds)[-1]:
        return Position(held=True, waiters_ahead=index)
    ahead = waits_on(kinds)
    if ahead is None:
        return _Place(held=False, waiters_ahead=index, queue_ahead=tuple(queue[:index]))
    return Position(held=False, ahead=f"{parent}/{queue[ahead]}".encode(), waiters_ahead=index)


class ZooKeeperBackend:
    """Lock primitives on one ZooKeeper ensemble. Thread-safe; opens new sessions lazily after ``fork()``."""

    unsupported: Mapping[str, str] = MappingProxyType({})  # every capability

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
        self._hosts = ",".join(_format_host(h, p) for h, p in hosts)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.description = f"ZooKeeper at {self._hosts}"
        self._mutex = threading.Lock()
        self._closed = False
        self._main: KazooClient | None = None
        self._sessions: dict[int, KazooClient] = {}
        self._expired: set[int] = set()
        self._abandoned: list[KazooClient] = []
        self._errors = ErrorTable(description=self.description, retryable=_retryable, translate=self._translate)

    # -- sessions ---------------------------------------------------------------------------------------------

    def _open(self, ttl: float, deadline: float) -> KazooClient:
        # The protocol carries the timeout as 32-bit milliseconds; the server lowers it to its maxSessionTimeout.
        ttl = min(ttl, _LONGEST_TIMEOUT)
        client = KazooClient(hosts=self._hosts, timeout=ttl, connection_retry={"max_tries": -1, "max_delay": 0.5})
        try:
            client.start(timeout=max(deadline - _clock.now(), 0.001))
        except KazooTimeoutError as e:
            self._discard(client)
            raise BackendUnavailable(f"could not open a session on {self.description}: no server answered") from e
        except kz.KazooException as e:
            self._discard(client)
            raise self._translate(e, "open a session") or e from e
        return client

    @staticmethod
    def _discard(client: KazooClient) -> None:
        try:
            client.stop()
        finally:
            client.close()

    def _main_client(self) -> KazooClient:
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            client = self._main
        if client is not None:
            return client
        opened = self._open(max(self.request_timeout, 10.0), _clock.now() + self.connect_timeout)
        with self._mutex:
            if self._main is None and not self._closed:
                self._main = opened
                return opened
            winner = self._main
        self._discard(opened)
        if winner is None:
            raise ClientClosed(f"the distlock client for {self.description} is closed")
        return winner

    def _session(self, lease_id: int) -> KazooClient:
        """The live session of ``lease_id``; ``LeaseGone`` when it expired or was revoked."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            client = self._sessions.get(lease_id)
            expired = lease_id in self._expired
        if client is None or expired or client.client_id is None or client.client_id[0] != lease_id:
            raise LeaseGone(f"lease {lease_id:x} (a ZooKeeper session) is gone on {self.description}")
        return client

    def _reader(self, ticket: Ticket) -> KazooClient:
        """The session that reads ``ticket``'s place: its own (which sees its own node), else the backend's."""
        try:
            return self._session(ticket.lease_id)
        except LeaseGone:
            return self._main_client()

    def after_fork(self) -> None:
        # The parent's sessions, sockets and threads are not ours: keep references, so that nothing closes them.
        self._mutex = threading.Lock()
        self._abandoned.extend(self._sessions.values())
        if self._main is not None:
            self._abandoned.append(self._main)
        self._sessions = {}
        self._expired = set()
        self._main = None

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            clients = list(self._sessions.values()) + ([self._main] if self._main is not None else [])
            self._sessions = {}
            self._main = None
        self._discard_within(clients, self.request_timeout)

    def _discard_within(self, clients: Sequence[KazooClient], timeout: float) -> None:
        """Close ``clients``' sessions (deleting their ephemeral nodes), waiting at most ``timeout`` s in all.

        kazoo's ``stop()`` waits for its connection thread, which gives up on a server that does not answer only
        after the session's read timeout: each runs on a thread of its own, left to finish in the background."""
        deadline = _clock.now() + timeout
        stoppers = [
            threading.Thread(target=self._discard, args=(client,), name="distlock-zk-close", daemon=True)
            for client in clients
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(max(deadline - _clock.now(), 0))

    # -- request plumbing -------------------------------------------------------------------------------------

    def _call(self, what: str, request: Callable[[Attempt], _R], budget: float | None = None) -> tuple[_R, int]:
        """Run ``request`` until it answers or the deadline passes; the answer and the attempts made.

        Each attempt waits for kazoo's asynchronous result only until the attempt's deadline: kazoo's blocking
        calls would wait for a reconnection without limit.
        """
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)
        return retrying(what, request, deadline, self._errors)

    def _translate(self, error: Exception, what: str) -> BackendError | None:
        if isinstance(error, (*_RETRYABLE, _MainSessionRenewing)):
            return BackendUnavailable(f"{what}: {self.description} did not answer ({type(error).__name__})")
        if isinstance(error, (kz.SessionExpiredError, kz.ConnectionClosedError)):
            # A lease's session that expired, or that a revoke closed under a request in another thread.
            return LeaseGone(f"{what}: the session is gone on {self.description}")
        if isinstance(error, (kz.NoAuthError, kz.AuthFailedError)):
            return AuthenticationFailed(f"{what}: {self.description} refused access ({type(error).__name__})")
        if isinstance(error, kz.KazooException):
            return BackendError(f"{what} failed on {self.description}: {type(error).__name__}: {error}")
        return None

    def _wait(self, result: Any, each: Attempt, client: KazooClient | None = None) -> Any:
        """kazoo's answer to one request on ``client``, waited for until the attempt's deadline at most."""
        try:
            return result.get(timeout=max(each.timeout, 0.001))
        except kz.ConnectionClosedError as e:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed") from e
            raise
        except kz.SessionExpiredError as e:
            if client is not None and client is self._main:
                # The backend's own session expired: kazoo is opening the next one; nothing was lost, try again.
                raise _MainSessionRenewing(self.description) from e
            raise

    def _lock_path(self, name: str) -> str:
        escaped = escape_name(name)
        if escaped in (".", ".."):  # not a valid path component; "%2E" never comes out of escape_name
            escaped = escaped.replace(".", "%2E")
        return f"{self._root}/{escaped}"

    def _children(self, client: KazooClient, path: str, what: str) -> list[str]:
        def request(each: Attempt) -> list[str]:
            try:
                return list(self._wait(client.get_children_async(path), each, client))
            except kz.NoNodeError:
                return []

        children, _ = self._call(what, request)
        return _queue(children)

    def _get(self, client: KazooClient, path: str, what: str) -> tuple[bytes, Any] | None:
        """The data and ``ZnodeStat`` of ``path``, or None when it does not exist."""

        def request(each: Attempt) -> tuple[bytes, Any] | None:
            try:
                data, stat = self._wait(client.get_async(path), each, client)
            except kz.NoNodeError:
                return None
            return bytes(data), stat

        found, _ = self._call(what, request)
        return found

    def _lock_nodes(self, client: KazooClient, what: str) -> list[str]:
        """The escaped names of every lock under this prefix (empty ones too)."""

        def request(each: Attempt) -> list[str]:
            try:
                return list(self._wait(client.get_children_async(self._root), each, client))
            except kz.NoNodeError:
                return []

        names, _ = self._call(what, request)
        return names

    def _stat(self, client: KazooClient, path: str, what: str) -> Any:
        """The ``ZnodeStat`` of ``path``, or None when it does not exist."""

        def request(each: Attempt) -> Any:
            return self._wait(client.exists_async(path), each, client)

        stat, _ = self._call(what, request)
        return stat

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        # A session of its own, closed again: a client that only takes locks then keeps one connection per lease,
        # not one more (ZooKeeper allows 60 connections per client address by default, maxClientCnxns). The
        # backend's own session is opened again when an inspector or operator first needs it.
        try:
            client = self._open(max(self.request_timeout, 10.0), _clock.now() + self.connect_timeout)
            try:
                self._call(
                    "connect",
                    lambda each: self._wait(client.exists_async(self._root), each, client),
                    self.connect_timeout,
                )
            finally:
                self._discard_within([client], self.request_timeout)
        except BackendUnavailable as e:
            hint = f"is ZooKeeper running there? ({e})"
            raise BackendUnavailable(unreachable(self.description, self.connect_timeout, hint)) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        client = self._open(ttl, _clock.now() + self.request_timeout)
        session_id = int(client.client_id[0])
        granted = float(client._session_timeout) / 1000.0  # what the server negotiated, in ms

        def on_state(state: str) -> bool:
            if state == KazooState.LOST:
                with self._mutex:
                    self._expired.add(session_id)
                return True  # the lease is over for good; kazoo's next session on this client is not it
            return False

        client.add_listener(on_state)
        with self._mutex:
            if self._closed:
                closed = True
            else:
                closed = False
                self._sessions[session_id] = client
        if closed:
            self._discard(client)
            raise ClientClosed(f"the distlock client for {self.description} is closed")
        return Lease(id=session_id, ttl=granted)

    def keep_alive(self, lease: Lease, timeout: float) -> float:
        lease_id = lease.id
        try:
            client = self._session(lease_id)
        except LeaseGone:
            return 0.0

        def request(each: Attempt) -> float:
            self._wait(client.exists_async("/"), each, client)  # any answer renews the session for its whole timeout
            if client.client_id is None or client.client_id[0] != lease_id:
                raise LeaseGone(f"lease {lease_id:x} is gone")
            return float(client._session_timeout) / 1000.0

        try:
            ttl, _ = self._call("lease keep-alive", request, min(timeout, self.request_timeout))
        except LeaseGone:
            return 0.0
        return ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        lease_id = lease.id
        with self._mutex:
            client = self._sessions.pop(lease_id, None)
            self._expired.discard(lease_id)
        if client is None:
            # Another client's session (an operator's revoke): only its owner can close it, so delete its nodes.
            self._delete_nodes_of(lease_id)
        else:
            self._discard_within([client], self.request_timeout)  # closing the session deletes its nodes

    def _delete_nodes_of(self, lease_id: int) -> None:
        """Delete every waiter's node under this prefix that lives on session ``lease_id`` (one read per lock)."""
        client = self._main_client()
        what = f"revoke lease {lease_id:x}"

        for escaped in self._lock_nodes(client, what):
            parent = f"{self._root}/{escaped}"
            for child in self._children(client, parent, what):
                stat = self._stat(client, f"{parent}/{child}", what)
                if stat is not None and int(stat.ephemeralOwner) == lease_id:
                    self._delete(client, f"{parent}/{child}", what)

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        client = self._session(lease_id)
        parent = self._lock_path(name)
        what = f"enqueue for lock {name!r}"

        def request(each: Attempt) -> tuple[str, Any]:
            if each.number > 1:
                # The earlier attempt may have made our node: take it rather than make a second one.
                try:
                    children = self._wait(client.get_children_async(parent), each, client)
                except kz.NoNodeError:
                    children = []
                for child in children:
                    if child.startswith(f"{nonce}-") and _sequence(child) >= 0:
                        stat = self._wait(client.exists_async(f"{parent}/{child}"), each, client)
                        if stat is not None:
                            return f"{parent}/{child}", stat
            path, stat = self._wait(
                client.create_async(
                    f"{parent}/{nonce}-", owner, ephemeral=True, sequence=True, makepath=True, include_data=True
                ),
                each,
            )
            return str(path), stat

        (path, stat), attempts = self._call(what, request)
        if int(stat.ephemeralOwner) != lease_id:
            # kazoo replaced an expired session between our check and the create: the node is not on our lease.
            self._delete(client, path, what)
            raise LeaseGone(f"{what}: lease {lease_id:x} (a ZooKeeper session) expired on {self.description}")
        ticket = Ticket(
            name=name, key=path.encode("utf-8"), token=int(stat.czxid), lease_id=lease_id, resent=attempts > 1
        )
        ours = kind_of(nonce)
        parent, _, mine = path.rpartition("/")
        queue = self._on_reader(ticket, lambda client: self._children(client, parent, what))
        try:
            refuse_mixed(name, ours, (kind_of(child) for child in queue if child != mine))
        except LockKindMismatch:
            self._delete(client, path, what)  # leave at once: nobody may count or pass a refused entry
            raise
        if mine not in queue:
            return ticket, Position(held=False, gone=True)
        return ticket, _place_in(parent, queue, queue.index(mine))

    def _on_reader(self, ticket: Ticket, request: Callable[[KazooClient], _R]) -> _R:
        """``request`` on the session that reads ``ticket``'s place; on the backend's own session when that one
        expired or was revoked meanwhile (the ticket's node is gone with it then, and any session can tell)."""
        try:
            return request(self._reader(ticket))
        except LeaseGone:
            return request(self._main_client())

    def position(self, ticket: Ticket) -> Position:
        path = ticket.key.decode("utf-8")
        parent, _, mine = path.rpartition("/")
        what = f"read queue of lock {ticket.name!r}"
        queue = self._on_reader(ticket, lambda client: self._children(client, parent, what))
        if mine not in queue:
            return Position(held=False, gone=True)
        return _place_in(parent, queue, queue.index(mine))

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        # A watch on the node ahead fires once, when it is deleted; a change of the connection's state wakes us too
        # (the caller reads its place again, and that read raises when the service stays away).
        client = self._reader(ticket)
        woken = threading.Event()

        def on_state(state: str) -> bool:
            woken.set()
            return True

        client.add_listener(on_state)
        unregister = interrupt.on_fire(woken.set)
        patience = self.request_timeout if timeout is None else min(timeout, self.request_timeout)
        try:
            try:
                if isinstance(position, _Place):
                    # A semaphore waiter: any change to the queue may be the one that lets it hold. If the entries
                    # ahead changed since its read, a deletion may have come before the watch: look again now.
                    parent, _, mine = ticket.key.decode("utf-8").rpartition("/")
                    children = client.get_children_async(parent, watch=lambda event: woken.set()).get(timeout=patience)
                    queue = _queue(children)
                    if mine not in queue or tuple(queue[: queue.index(mine)]) != position.queue_ahead:
                        return None
                else:
                    ahead = position.ahead.decode("utf-8")
                    stat = client.exists_async(ahead, watch=lambda event: woken.set()).get(timeout=patience)
                    if stat is None:
                        return None  # already gone
            except (kz.KazooException, KazooTimeoutError):
                return None  # the caller's next read retries, and raises if the service stays away
            woken.wait(timeout)
        finally:
            unregister()
            client.remove_listener(on_state)
        return None

    def _delete(self, client: KazooClient, path: str, what: str) -> bool:
        def request(each: Attempt) -> bool:
            try:
                self._wait(client.delete_async(path, version=0), each, client)
            except kz.NoNodeError:
                return False
            return True

        deleted, attempts = self._call(what, request)
        return deleted or attempts > 1  # a retried delete whose first attempt landed finds nothing: done

    def dequeue(self, ticket: Ticket) -> bool:
        what = f"release lock {ticket.name!r}"
        return self._on_reader(ticket, lambda client: self._delete(client, ticket.key.decode("utf-8"), what))

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        # One multi-op: the ticket's node still exists (version 0: it is never written after it is made) and the
        # lock's own node takes the value. A session the ensemble expired has had its nodes deleted, so a holder
        # frozen past its session timeout is refused even before anyone else holds.
        what = f"write the record of lock {ticket.name!r}"

        def request(client: KazooClient) -> bool:
            def attempt(each: Attempt) -> bool:
                transaction = client.transaction()
                transaction.check(ticket.key.decode("utf-8"), 0)
                transaction.set_data(self._lock_path(ticket.name), value)
                results = self._wait(transaction.commit_async(), each, client)
                return not any(isinstance(result, Exception) for result in results)

            written, _ = self._call(what, attempt)
            return written

        return self._on_reader(ticket, request)

    def read_record(self, name: str) -> bytes | None:
        client = self._main_client()
        parent = self._lock_path(name)
        what = f"read the record of lock {name!r}"
        self._call(what, lambda each: self._wait(client.sync_async(parent), each, client))
        found = self._get(client, parent, what)
        return found[0] if found is not None and found[0] else None

    def _head(self, name: str) -> tuple[str, bytes, Any, int, int] | None:
        """The holder's node of ``name``: its path, data, stat, the number of entries that wait and the number
        that hold (several for a semaphore or readers)."""
        client = self._main_client()
        parent = self._lock_path(name)
        what = f"read holder of lock {name!r}"
        # A sync first: this session then sees every write the ensemble committed before it (another session's
        # release or join), as a linearizable read would.
        self._call(what, lambda each: self._wait(client.sync_async(parent), each, client))
        while True:
            queue = self._children(client, parent, what)
            if not queue:
                return None
            path = f"{parent}/{queue[0]}"
            found = self._get(client, path, what)
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
        client = self._main_client()
        parent = self._lock_path(name)
        what = f"look for a late join of lock {name!r}"
        self._call(what, lambda each: self._wait(client.sync_async(parent), each, client))
        for child in self._children(client, parent, what):
            if child.startswith(f"{nonce}-"):
                stat = self._stat(client, f"{parent}/{child}", what)
                if stat is not None and int(stat.ephemeralOwner) == lease.id:
                    self._delete(client, f"{parent}/{child}", what)
                    return int(stat.czxid)
        return None

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One pipelined round: every exists request goes out before the first answer is awaited.
        if not tickets:
            return []
        lease_id = tickets[0].lease_id
        client = self._session(lease_id)

        def request(each: Attempt) -> list[Ticket]:
            results = [client.exists_async(ticket.key.decode("utf-8")) for ticket in tickets]
            answers = [self._wait(result, each) for result in results]
            return [ticket for ticket, stat in zip(tickets, answers, strict=True) if stat is None]

        missing, _ = self._call("check held locks", request)
        if client.client_id is None or client.client_id[0] != lease_id:
            raise LeaseGone(f"check held locks: lease {lease_id:x} is gone on {self.description}")
        return missing

    def _ttl_left(self, session_id: int) -> float | None:
        """The time left of one of our own sessions while it is connected: its whole timeout, which the server
        starts again on every packet (kazoo pings a third of the way in). None for another client's session:
        ZooKeeper does not tell one session how long another has."""
        with self._mutex:
            client = self._sessions.get(session_id)
        if client is None or client.state != KazooState.CONNECTED or client.client_id is None:
            return None
        return float(client._session_timeout) / 1000.0 if client.client_id[0] == session_id else None

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order."""
        client = self._main_client()
        what = "inspect locks"
        self._call(what, lambda each: self._wait(client.sync_async(self._root), each, client))
        states = []
        for escaped in self._lock_nodes(client, what):
            parent = f"{self._root}/{escaped}"
            waiters, kinds = [], []
            for child in self._children(client, parent, what):
                found = self._get(client, f"{parent}/{child}", what)
                if found is not None:
                    data, stat = found
                    kinds.append(kind_of(child))
                    waiters.append(
                        Waiter(
                            owner=owner_id(data),
                            token=int(stat.czxid),
                            lease_id=int(stat.ephemeralOwner),
                            ttl_left=self._ttl_left(int(stat.ephemeralOwner)),
                        )
                    )
            if waiters:
                states.append(lock_state(unescape_name(escaped), waiters, kinds))
        return sorted(states, key=lambda state: state.name)
