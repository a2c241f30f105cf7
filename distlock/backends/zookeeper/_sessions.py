"""ZooKeeper sessions for the backend: one per lease, one of the backend's own, and requests on them with retries.

A lease is a ZooKeeper session (a ``KazooClient``) of its own, opened with the lease's TTL as its timeout (the server
negotiates it): ZooKeeper ties an ephemeral node to the session that made it and fixes the timeout when the session
opens, so revoking one lease closes one session. The backend's own session, opened on first use, reads holders,
lists locks and deletes others' nodes. A ticket's place is read on its own session, which sees its own writes.
``call`` runs a request until it answers or ``request_timeout`` passes, each attempt waiting for kazoo's answer
(``answer``) only until the attempt's deadline. The layout's writes live here too: ``join`` makes a lock's node (a
CONTAINER: kazoo has no call for one, so ``make_lock_node`` sends ZooKeeper's own request) and an entry in it in one
flight, making the lock's node again when it was removed between the two; ``delete`` removes an entry and then its
lock's node, if that was the last entry and holds no record (``prune``). Why that is race-free:
docs/operations/zookeeper.md, "What stays behind".

What can go wrong: no server answers (``BackendUnavailable``, kazoo's exception as ``__cause__``); a lease's session
expired or closed by a revoke (``LeaseGone``); an ACL that refuses us (``AuthenticationFailed``); a closed client
(``ClientClosed``); any other kazoo error (``BackendError``). The backend's own session may expire too: kazoo opens
the next one and the request is sent again on it. Every session is a TCP connection and two kazoo threads. Only
``_backend`` imports this module, after checking that the ``zookeeper`` extra is installed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kazoo import exceptions as kz
from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Create2
from kazoo.security import OPEN_ACL_UNSAFE

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ClientClosed
from ..._protocol import Lease, LeaseGone, Ticket
from ..._retry import Attempt, ErrorTable, retrying

__all__ = ["RECORD_PIN", "Sessions", "queue_order", "sequence"]

_R = TypeVar("_R")

#: The longest session timeout a client can ask for (the protocol's 32-bit milliseconds), in seconds.
_LONGEST_TIMEOUT = (2**31 - 1) / 1000

_RETRYABLE: tuple[type[Exception], ...] = (kz.ConnectionLoss, kz.OperationTimeoutError, KazooTimeoutError)

#: The empty PERSISTENT child that keeps a lock's node whose record was written: the server reclaims an empty
#: CONTAINER whatever its data. Not an entry (no sequence number), so no reader of the queue counts it.
RECORD_PIN = "record"

#: ``CreateMode.CONTAINER``'s flag, sent with ZooKeeper's ``createContainer`` request (a ``create`` with this flag
#: makes a plain PERSISTENT node).
_CONTAINER = 4


class _CreateContainer(Create2):  # type: ignore[misc]  # kazoo is untyped
    """ZooKeeper's ``createContainer`` request (opcode 19, since 3.5.3): a ``create2``'s body and answer."""

    type = 19


class _MainSessionRenewing(Exception):
    """The backend's own session (not a lease) expired under a request; kazoo opens a new one by itself."""


def _retryable(error: Exception) -> bool:
    return isinstance(error, (*_RETRYABLE, _MainSessionRenewing))


def _cut_stalled_handshakes(client: KazooClient, patience: float) -> None:
    """Drop any connection attempt of ``client`` that is still not a session after ``patience`` s, so that kazoo
    tries again at once.

    kazoo waits for the answer to its handshake for the whole session timeout (a lease's TTL, or the backend's own
    session's). A server that is starting can accept a connection and never answer it (ZooKeeper's listening socket
    is open before the server runs: ZOOKEEPER-3916); the session then stays away for that long, and a lease's session
    expires on the server meanwhile, though the server answered a fresh connection within a second. Each time the
    connection is lost (and once at the start), a timer checks every ``patience`` s while the session is not
    connected, and shuts down the socket of an attempt it saw at its previous check: kazoo's read wakes, finds the
    connection broken and connects again. Through kazoo's private ``_connection._socket`` (2.10 and 2.11 have it);
    the restart tests catch a kazoo that changed it, by a hang as long as a session timeout."""

    def check(seen: socket.socket | None) -> None:
        if client._stopped.is_set() or client.state == KazooState.CONNECTED:
            return
        attempt: socket.socket | None = getattr(client._connection, "_socket", None)
        if attempt is not None and attempt is seen:
            with contextlib.suppress(OSError):
                attempt.shutdown(socket.SHUT_RDWR)
        watch(attempt)

    def watch(seen: socket.socket | None) -> None:
        timer = threading.Timer(patience, check, args=(seen,))
        timer.name = "distlock-zk-handshake"
        timer.daemon = True
        timer.start()

    def on_state(state: str) -> bool:
        if state == KazooState.SUSPENDED:
            watch(None)
        return False

    client.add_listener(on_state)
    watch(None)


def sequence(child: str) -> int:
    """The sequence number ZooKeeper appended to a waiter's node name (``<nonce>-<lease hex>-0000000042`` -> 42)."""
    _, _, number = child.rpartition("-")
    return int(number) if number.isdigit() else -1


def queue_order(children: Sequence[str]) -> list[str]:
    """A lock's waiters in queue order (the sequence numbers), anything else left out."""
    return sorted((child for child in children if sequence(child) >= 0), key=sequence)


def _format_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Sessions:
    """The sessions of one backend on one ensemble, by lease id, and the backend's own. Thread-safe."""

    def __init__(self, hosts: list[tuple[str, int]], *, connect_timeout: float, request_timeout: float) -> None:
        self._hosts = ",".join(_format_host(h, p) for h, p in hosts)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.description = f"ZooKeeper at {self._hosts}"
        self._mutex = threading.Lock()
        self._closed = False
        self._main: KazooClient | None = None
        self._leases: dict[int, KazooClient] = {}
        self._expired: set[int] = set()
        self._abandoned: list[KazooClient] = []
        self._errors = ErrorTable(description=self.description, retryable=_retryable, translate=self.translate)

    def open(self, ttl: float, deadline: float) -> KazooClient:
        # The protocol carries the timeout as 32-bit milliseconds; the server lowers it to its maxSessionTimeout.
        ttl = min(ttl, _LONGEST_TIMEOUT)
        client = KazooClient(hosts=self._hosts, timeout=ttl, connection_retry={"max_tries": -1, "max_delay": 0.5})
        _cut_stalled_handshakes(client, self.connect_timeout)
        try:
            client.start(timeout=max(deadline - _clock.now(), 0.001))
        except KazooTimeoutError as e:
            self.stop(client)
            raise BackendUnavailable(f"could not open a session on {self.description}: no server answered") from e
        except kz.KazooException as e:
            self.stop(client)
            raise self.translate(e, "open a session") or e from e
        return client

    @staticmethod
    def stop(client: KazooClient) -> None:
        try:
            client.stop()
        finally:
            client.close()

    def main(self) -> KazooClient:
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            client = self._main
        if client is not None:
            return client
        opened = self.open(max(self.request_timeout, 10.0), _clock.now() + self.request_timeout)
        with self._mutex:
            if self._main is None and not self._closed:
                self._main = opened
                return opened
            winner = self._main
        self.stop(opened)
        if winner is None:
            raise ClientClosed(f"the distlock client for {self.description} is closed")
        return winner

    def of_lease(self, lease_id: int) -> KazooClient:
        """The live session of ``lease_id``; ``LeaseGone`` when it expired or was revoked. A session whose connection
        is being made again is live: its requests wait for it (kazoo queues them), and the server keeps its nodes
        until its timeout; only the server can say it expired, which kazoo reports (``KazooState.LOST``)."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            client = self._leases.get(lease_id)
            expired = lease_id in self._expired
        if client is None or expired or self.replaced(client, lease_id):
            raise LeaseGone(f"lease {lease_id:x} (a ZooKeeper session) is gone on {self.description}")
        return client

    @staticmethod
    def replaced(client: KazooClient, lease_id: int) -> bool:
        """Whether ``client`` is connected on a session other than ``lease_id``'s: kazoo opened the next one after
        the lease's expired. (kazoo's ``client_id`` is None while a connection is being made again.)"""
        session = client.client_id
        return session is not None and session[0] != lease_id

    def reader(self, ticket: Ticket) -> KazooClient:
        """The session that reads ``ticket``'s place: its own (which sees its own node), else the backend's."""
        try:
            return self.of_lease(ticket.lease_id)
        except LeaseGone:
            return self.main()

    def on_reader(self, ticket: Ticket, request: Callable[[KazooClient], _R]) -> _R:
        """``request`` on the session that reads ``ticket``'s place; on the backend's own session when that one
        expired or was revoked meanwhile (the ticket's node is gone with it then, and any session can tell)."""
        try:
            return request(self.reader(ticket))
        except LeaseGone:
            return request(self.main())

    def open_lease(self, ttl: float) -> Lease:
        """A new session for a lease of ``ttl`` s; the lease's TTL is the timeout the server negotiated."""
        client = self.open(ttl, _clock.now() + self.request_timeout)
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
                self._leases[session_id] = client
        if closed:
            self.stop(client)
            raise ClientClosed(f"the distlock client for {self.description} is closed")
        return Lease(id=session_id, ttl=granted)

    def close_lease(self, lease_id: int) -> bool | None:
        """Close ``lease_id``'s session (deleting its nodes); None when it is not one of ours, else whether its
        nodes are known gone: it had expired, or its client was connected to close it (not cut off)."""
        with self._mutex:
            client = self._leases.pop(lease_id, None)
            expired = lease_id in self._expired
            self._expired.discard(lease_id)
        if client is None:
            return None
        gone = expired or self.replaced(client, lease_id) or bool(client.connected)
        self.close_within([client], self.request_timeout)
        return gone

    def ttl_left(self, session_id: int) -> float | None:
        """The time left of one of our own sessions while it is connected: its whole timeout, which the server
        starts again on every packet (kazoo pings a third of the way in). None for another client's session:
        ZooKeeper does not tell one session how long another has."""
        with self._mutex:
            client = self._leases.get(session_id)
        if client is None or client.state != KazooState.CONNECTED or client.client_id is None:
            return None
        return float(client._session_timeout) / 1000.0 if client.client_id[0] == session_id else None

    def after_fork(self) -> None:
        # The parent's sessions, sockets and threads are not ours: keep references, so that nothing closes them.
        self._mutex = threading.Lock()
        self._abandoned.extend(self._leases.values())
        if self._main is not None:
            self._abandoned.append(self._main)
        self._leases = {}
        self._expired = set()
        self._main = None

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            clients = list(self._leases.values()) + ([self._main] if self._main is not None else [])
            self._leases = {}
            self._main = None
        self.close_within(clients, self.request_timeout)

    def close_within(self, clients: Sequence[KazooClient], timeout: float) -> None:
        """Close ``clients``' sessions (deleting their ephemeral nodes), waiting at most ``timeout`` s in all.

        kazoo's ``stop()`` waits for its connection thread, which gives up on a server that does not answer only
        after the session's read timeout: each runs on a thread of its own, left to finish in the background."""
        deadline = _clock.now() + timeout
        stoppers = [
            threading.Thread(target=self.stop, args=(client,), name="distlock-zk-close", daemon=True)
            for client in clients
        ]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(max(deadline - _clock.now(), 0))

    def call(
        self, what: str, request: Callable[[Attempt], _R], budget: float | None = None, *, read: bool = False
    ) -> tuple[_R, int]:
        """Run ``request`` until it answers or the deadline passes; the answer and the attempts made.

        Each attempt waits for kazoo's asynchronous result only until the attempt's deadline: kazoo's blocking
        calls would wait for a reconnection without limit. A ``read`` attempt waits ``connect_timeout`` at most and
        is then sent again: a read is safe to repeat, and kazoo can leave a request sent as its session expired
        unanswered for good (seen with kazoo 2.10.0 across a server restart; the next attempt finds the session gone
        and reads on the backend's own).
        """
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)
        each = (lambda number: self.connect_timeout) if read else None
        return retrying(what, request, deadline, self._errors, each)

    def translate(self, error: Exception, what: str) -> BackendError | None:
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

    def answer(self, result: Any, each: Attempt, client: KazooClient | None = None) -> Any:
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

    def children(self, client: KazooClient, path: str, what: str) -> list[str]:
        """The waiters' nodes under ``path`` in queue order (none when it does not exist)."""

        def request(each: Attempt) -> list[str]:
            try:
                return list(self.answer(client.get_children_async(path), each, client))
            except kz.NoNodeError:
                return []

        children, _ = self.call(what, request, read=True)
        return queue_order(children)

    def get(self, client: KazooClient, path: str, what: str) -> tuple[bytes, Any] | None:
        """The data and ``ZnodeStat`` of ``path``, or None when it does not exist."""

        def request(each: Attempt) -> tuple[bytes, Any] | None:
            try:
                data, stat = self.answer(client.get_async(path), each, client)
            except kz.NoNodeError:
                return None
            return bytes(data), stat

        found, _ = self.call(what, request, read=True)
        return found

    def stat(self, client: KazooClient, path: str, what: str) -> Any:
        """The ``ZnodeStat`` of ``path``, or None when it does not exist."""

        def request(each: Attempt) -> Any:
            return self.answer(client.exists_async(path), each, client)

        stat, _ = self.call(what, request)
        return stat

    def make_lock_node(self, client: KazooClient, path: str) -> Any:
        """Send the request that makes the lock's node ``path`` (or a marks' node, ``_marks``) as an empty CONTAINER;
        kazoo's async result of it (``NodeExistsError`` when it exists, ``NoNodeError`` when its parent does not).

        Through kazoo's private ``_call`` (2.10 and later have it; every join passes here, so any lock test catches
        a kazoo that changed it). Our sessions have no kazoo chroot (the URL's is in every path): ``path`` goes as is.
        """
        result = client.handler.async_result()
        client._call(_CreateContainer(path, b"", client.default_acl or OPEN_ACL_UNSAFE, _CONTAINER), result)
        return result

    def join(self, client: KazooClient, lock_node: str, entry: str, data: bytes, each: Attempt) -> tuple[str, Any]:
        """Make the EPHEMERAL SEQUENTIAL node ``<lock_node>/<entry><sequence>`` with ``data``, and ``lock_node``
        first when it is missing; its path and ``ZnodeStat``.

        Both creates go out in one flight, and ZooKeeper applies a session's requests in order. The lock's node may
        be removed between the two (the last entry of its previous queue pruned it, or the server's container check
        did): the entry's create then fails with ``NoNodeError``, having made nothing, and both are sent again. A
        missing prefix node is made (PERSISTENT, with kazoo's ``ensure_path``) before they are.
        """
        while True:
            made = self.make_lock_node(client, lock_node)
            created = client.create_async(
                f"{lock_node}/{entry}", data, ephemeral=True, sequence=True, include_data=True
            )
            prefix_missing = False
            try:
                self.answer(made, each, client)
            except kz.NodeExistsError:
                pass
            except kz.NoNodeError:
                prefix_missing = True
            try:
                path, stat = self.answer(created, each, client)
            except kz.NoNodeError:
                if prefix_missing:
                    self.answer(client.ensure_path_async(lock_node.rpartition("/")[0]), each, client)
                if each.timeout <= 0:
                    raise KazooTimeoutError(f"{lock_node} was removed under every join until the deadline") from None
                continue
            return str(path), stat

    def delete(self, client: KazooClient, path: str, what: str) -> bool:
        """Delete the waiter's node ``path`` (at version 0: it is never written after it is made), and then its
        lock's node if that is left empty (``prune``); False when ``path`` was gone already."""
        lock_node = path.rpartition("/")[0]

        def request(each: Attempt) -> bool:
            # One flight: the lock's node is deleted after the entry, or refused while other entries remain.
            deleted, pruned = client.delete_async(path, version=0), client.delete_async(lock_node, version=0)
            try:
                self.answer(deleted, each, client)
                found = True
            except kz.NoNodeError:
                found = False
            self._pruned(client, lock_node, pruned, each)
            return found

        deleted, attempts = self.call(what, request)
        return deleted or attempts > 1  # a retried delete whose first attempt landed finds nothing: done

    def prune(self, client: KazooClient, lock_nodes: Sequence[str], what: str) -> None:
        """Delete each of ``lock_nodes`` that has no entry left and no record (every delete in one flight)."""

        def request(each: Attempt) -> None:
            results = [(lock_node, client.delete_async(lock_node, version=0)) for lock_node in lock_nodes]
            for lock_node, result in results:
                self._pruned(client, lock_node, result, each)

        self.call(what, request)

    def _pruned(self, client: KazooClient, lock_node: str, result: Any, each: Attempt) -> None:
        """Wait for the version-checked delete of ``lock_node``: refused while an entry or the record's pin is in
        it (``NotEmptyError``) or once a record was written (``BadVersionError``: version 0 is a node never
        written); ``NoNodeError`` when another prune or the server's container check removed it first."""
        try:
            self.answer(result, each, client)
        except (kz.NotEmptyError, kz.NoNodeError):
            pass
        except kz.BadVersionError:
            # A record without its pin: an older distlock wrote it. Pin it now, before the server reclaims it.
            with contextlib.suppress(kz.NodeExistsError, kz.NoNodeError):
                self.answer(client.create_async(f"{lock_node}/{RECORD_PIN}"), each, client)
