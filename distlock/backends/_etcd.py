"""The etcd backend: the primitives of ``_protocol.Backend`` over etcd's v3 gRPC API.

It talks gRPC itself through ``grpcio`` and takes only the generated protobuf messages and service stubs from the
``python3-etcd3`` package (``etcd3.etcdrpc``): that client's higher-level helpers are wrong in ways that matter here
(its ``max_create_revision`` read sets ``min_mod_revision``, its transactions cannot sort, limit or return a revision,
its watch thread dies with ``NameError`` on a broken stream). Everything this module sends is built from messages.

The queue follows etcd's Go ``concurrency.Mutex``: every waiter puts its own key ``<prefix>/<escaped name>/<lease
hex>-<nonce>`` on its client's lease; the key with the smallest create revision holds the lock, and that revision is
the fencing token. A waiter watches only the key just ahead of it, so a release wakes one waiter. The watch starts
at the store's current revision, not right after the read that found the key ahead (etcd serves a watch that starts
in the past only every 100 ms); when the watch starts at a later revision than that read, the waiter reads its
place again before it blocks, so no deletion between the read and the watch goes unseen.

What can go wrong: any member may be unreachable, restarting, or between leaders. Every request here is idempotent
(puts are guarded by ``create_revision == 0``, deletes by ``create_revision == token``), so UNAVAILABLE answers are
retried with backoff until the request timeout, across every endpoint the channel knows; then
``BackendUnavailable`` names the endpoints. A retried delete whose first attempt may have landed is reported as
done, not as "already gone".
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _clock
from .._errors import AuthenticationFailed, BackendError, BackendUnavailable, ClientClosed, ConfigurationError
from .._names import escape_name, unescape_name
from .._protocol import Holder, Interrupt, Lease, LeaseGone, LockState, Position, Ticket, Waiter, owner_id
from .._retry import Attempt, ErrorTable, retrying

try:
    import grpc
    from etcd3 import etcdrpc
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the etcd backend needs the 'etcd' extra: pip install 'distlock[etcd]' (grpcio, protobuf, python3-etcd3)"
    ) from _e

__all__ = ["EtcdBackend", "TLSConfig"]

_R = TypeVar("_R")

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class TLSConfig:
    """TLS for the etcd connection: a CA bundle (None: the system roots) and an optional client certificate."""

    ca_cert: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as f:
                    return f.read()
            except OSError as e:
                raise ConfigurationError(f"cannot read the etcd {what} file {path!r}: {e.strerror}") from e

        if (self.client_cert is None) != (self.client_key is None):
            raise ConfigurationError("a TLS client certificate needs both cert and key (or neither)")
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_cert, "CA certificate"),
            private_key=read(self.client_key, "client key"),
            certificate_chain=read(self.client_cert, "client certificate"),
        )


@dataclass(frozen=True)
class _EtcdPosition(Position):
    """A waiting position, with the store ``revision`` it was read at: ``wait()`` compares its watch's start to it."""

    revision: int = 0


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix`` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _format_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class EtcdBackend:
    """Lock primitives on one etcd cluster. Thread-safe; reconnects lazily after ``fork()``."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        prefix: str,
        tls: TLSConfig | None = None,
        username: str | None = None,
        password: str | None = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 5.0,
    ) -> None:
        if not endpoints:
            raise ConfigurationError("an etcd URL needs at least one host:port")
        if (username is None) != (password is None):
            raise ConfigurationError("etcd authentication needs both a user name and a password")
        self._endpoints = endpoints
        self._prefix = prefix.encode("utf-8") + b"/"
        self._tls = tls
        self._credentials = tls.credentials() if tls is not None else None
        self._username = username
        self._password = password
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        where = ",".join(_format_host(h, p) for h, p in endpoints)
        self.description = f"etcd at {where}"
        self._mutex = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._abandoned: list[grpc.Channel] = []
        self._auth_token: str | None = None
        self._kv: Any = None
        self._lease: Any = None
        self._watch: Any = None
        self._closed = False
        self._errors = ErrorTable(
            description=self.description,
            retryable=lambda e: isinstance(e, grpc.RpcError) and _code(e) in _RETRYABLE,
            translate=lambda e, what: self._translate(e, what) if isinstance(e, grpc.RpcError) else None,
            recover=self._recover,
        )

    # -- connection -------------------------------------------------------------------------------------------

    def _target(self) -> tuple[str, list[tuple[str, Any]]]:
        options: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.enable_retries", 0),
        ]
        if len(self._endpoints) == 1:
            host, port = self._endpoints[0]
            return _format_host(host, port), options
        # Several members: gRPC's static address list needs IP addresses; resolve names now. round_robin spreads
        # requests, so a member that lost its leader (and answers "no leader") is only one of the retry targets.
        addresses: list[str] = []
        for host, port in self._endpoints:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as e:
                raise BackendUnavailable(f"cannot resolve etcd host {host!r}: {e}") from e
            ip = str(infos[0][4][0])
            addresses.append(_format_host(ip, port))
        family = "ipv6" if any(a.startswith("[") for a in addresses) else "ipv4"
        options.append(("grpc.lb_policy_name", "round_robin"))
        if self._tls is not None:
            options.append(("grpc.ssl_target_name_override", self._endpoints[0][0]))
        return f"{family}:{','.join(addresses)}", options

    def _connect(self) -> grpc.Channel:
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            if self._channel is None:
                target, options = self._target()
                if self._credentials is not None:
                    channel = grpc.secure_channel(target, self._credentials, options=options)
                else:
                    channel = grpc.insecure_channel(target, options=options)
                self._kv = etcdrpc.KVStub(channel)
                self._lease = etcdrpc.LeaseStub(channel)
                self._watch = etcdrpc.WatchStub(channel)
                self._channel = channel
            return self._channel

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        token = self._auth_token
        return (("token", token),) if token is not None else None

    def _authenticate(self, deadline: float) -> None:
        if self._username is None:
            return
        channel = self._connect()
        stub = etcdrpc.AuthStub(channel)
        request = etcdrpc.AuthenticateRequest(name=self._username, password=self._password)
        response, _ = self._retrying("authenticate", lambda t: stub.Authenticate(request, timeout=t), deadline)
        self._auth_token = str(response.token)

    def after_fork(self) -> None:
        # The parent's channel and its threads are not ours: keep a reference (so no finaliser touches them in the
        # child) and open a new channel on first use.
        self._mutex = threading.Lock()
        if self._channel is not None:
            self._abandoned.append(self._channel)
        self._channel = None

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    # -- request plumbing -------------------------------------------------------------------------------------

    def _retrying(self, what: str, call: Callable[[float], _R], deadline: float) -> tuple[_R, int]:
        """Run ``call(timeout)`` until it answers, retrying UNAVAILABLE with backoff until ``deadline``; return the
        answer and the attempts made."""

        def attempt(attempt: Attempt) -> _R:
            try:
                return call(attempt.timeout)
            except ValueError as e:
                if not _closed_channel(e):
                    raise
                raise ClientClosed(f"{what}: the distlock client for {self.description} is closed") from e

        return retrying(what, attempt, deadline, self._errors)

    def _recover(self, error: Exception, deadline: float) -> bool:
        """An expired auth token: authenticate again and retry at once."""
        if isinstance(error, grpc.RpcError) and _is_expired_token(error) and self._username is not None:
            self._authenticate(deadline)
            return True
        return False

    def _unary(self, what: str, method: str, request: Any, *, budget: float | None = None) -> tuple[Any, bool]:
        """One unary request with retries; returns the response and whether an earlier attempt may have landed."""
        self._connect()
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)

        def call(timeout: float) -> Any:
            stub = self._kv if method in ("Txn", "Range") else self._lease
            return getattr(stub, method)(request, timeout=timeout, metadata=self._metadata())

        response, attempts = self._retrying(what, call, deadline)
        return response, attempts > 1

    def _translate(self, error: grpc.RpcError, what: str) -> BackendError:
        code = _code(error)
        details = _details(error)
        # A deadline that runs out inside etcd comes back as UNKNOWN "context deadline exceeded".
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or "context deadline" in details:
            return BackendUnavailable(f"{what}: {self.description} is unavailable ({code.name}: {details})")
        lowered = details.lower()
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
            code == grpc.StatusCode.INVALID_ARGUMENT and ("auth" in lowered or "user name" in lowered)
        ):
            hint = (
                " (etcd has authentication enabled: put the user in the URL, etcd://user:password@host:port)"
                if self._username is None
                else f" (user {self._username!r})"
            )
            return AuthenticationFailed(f"{what}: {self.description} refused the credentials: {details}{hint}")
        if code == grpc.StatusCode.NOT_FOUND and "lease" in lowered:
            return LeaseGone(f"{what}: the lease is gone on {self.description}")
        return BackendError(f"{what} failed on {self.description}: {code.name}: {details}")

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        deadline = _clock.now() + self.connect_timeout
        self._connect()
        self._authenticate(deadline)
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=_prefix_end(self._prefix), count_only=True)
        try:
            self._unary("connect", "Range", request, budget=max(deadline - _clock.now(), 0.001))
        except BackendUnavailable as e:
            raise BackendUnavailable(
                f"could not reach {self.description} within {self.connect_timeout:g} s "
                f"(connect_timeout); is etcd running there? ({e})"
            ) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        response, _ = self._unary("grant lease", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=math.ceil(ttl)))
        if response.error:
            raise BackendError(f"grant lease failed on {self.description}: {response.error}")
        return Lease(id=int(response.ID), ttl=float(response.TTL))

    def keep_alive(self, lease_id: int, timeout: float) -> float:
        self._connect()
        deadline = _clock.now() + min(timeout, self.request_timeout)

        def once(timeout: float) -> float:
            request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
            responses = self._lease.LeaseKeepAlive(iter((request,)), timeout=timeout, metadata=self._metadata())
            try:
                for response in responses:
                    return float(response.TTL)
                return 0.0
            finally:
                responses.cancel()

        ttl, _ = self._retrying("lease keep-alive", once, deadline)
        return ttl

    def revoke_lease(self, lease_id: int) -> None:
        with contextlib.suppress(LeaseGone):
            self._unary("revoke lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id))

    def _lock_prefix(self, name: str) -> bytes:
        return self._prefix + escape_name(name).encode("utf-8") + b"/"

    def enqueue(self, name: str, lease_id: int, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        prefix = self._lock_prefix(name)
        end = _prefix_end(prefix)
        key = prefix + f"{lease_id:x}-{nonce}".encode("ascii")
        # After our put, our key is the newest in the range: the two newest keys are us and the waiter just ahead.
        newest_two = etcdrpc.RangeRequest(
            key=prefix,
            range_end=end,
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=2,
            keys_only=True,
        )
        request = etcdrpc.TxnRequest(
            compare=[
                etcdrpc.Compare(result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, key=key, create_revision=0)
            ],
            success=[
                etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=owner, lease=lease_id)),
                etcdrpc.RequestOp(request_range=newest_two),
            ],
            failure=[etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, keys_only=True))],
        )
        response, _ = self._unary(f"enqueue for lock {name!r}", "Txn", request)
        if not response.succeeded:
            # A retry of a put that landed: the key is ours already. Read our place the ordinary way.
            kvs = response.responses[0].response_range.kvs
            if not kvs:
                raise BackendError(f"enqueue for lock {name!r}: key vanished inside a transaction")
            ticket = Ticket(name=name, key=key, revision=int(kvs[0].create_revision), lease_id=lease_id)
            return ticket, self.position(ticket)
        revision = int(response.header.revision)
        ticket = Ticket(name=name, key=key, revision=revision, lease_id=lease_id)
        newest = response.responses[1].response_range
        ahead = [kv for kv in newest.kvs if kv.key != key]
        if not ahead:
            return ticket, Position(held=True, waiters_ahead=0)
        return ticket, _EtcdPosition(
            held=False,
            ahead=bytes(ahead[0].key),
            revision=revision,
            waiters_ahead=int(newest.count) - 1,
        )

    def position(self, ticket: Ticket) -> Position:
        # One plain Range, not a read-only Txn: etcd before 3.5.5 panics when a read-only Txn's context is cancelled
        # in flight (etcd-io/etcd#14110) -- a client closed or a deadline hit mid-read would take the member down.
        # Create revisions in a queue are unique, so the newest key created at or before our ticket is our own key
        # (gone if it is someone else's), and the one after it in this order is the waiter just ahead of us.
        prefix = self._lock_prefix(ticket.name)
        request = etcdrpc.RangeRequest(
            key=prefix,
            range_end=_prefix_end(prefix),
            max_create_revision=ticket.revision,
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=2,
            keys_only=True,
        )
        response, _ = self._unary(f"read queue of lock {ticket.name!r}", "Range", request)
        revision = int(response.header.revision)
        kvs = response.kvs
        if not kvs or bytes(kvs[0].key) != ticket.key or int(kvs[0].create_revision) != ticket.revision:
            return Position(held=False, gone=True)
        if len(kvs) < 2:
            return Position(held=True, waiters_ahead=0)
        return _EtcdPosition(
            held=False,
            ahead=bytes(kvs[1].key),
            revision=revision,
            waiters_ahead=int(response.count) - 1,
        )

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> None:
        self._connect()
        # Watch from "now", not from the read's revision + 1: etcd serves a watch that starts in the past from its
        # unsynced-watcher loop, every 100 ms, and under contention the revision has always moved on by the time
        # the watch is created. A deletion between our read and the watch's start would then go unseen, so when
        # the watch starts later than the read, we read the queue again (one more request) before waiting.
        read_at = position.revision if isinstance(position, _EtcdPosition) else 0  # 0: always read again
        create = etcdrpc.WatchCreateRequest(key=position.ahead, filters=[etcdrpc.WatchCreateRequest.NOPUT])
        started = _clock.now()
        try:
            responses = self._watch.Watch(
                iter((etcdrpc.WatchRequest(create_request=create),)), timeout=timeout, metadata=self._metadata()
            )
        except ValueError as e:
            if not _closed_channel(e):
                raise
            return  # the caller's next read reports the closed client
        unregister = interrupt.on_fire(responses.cancel)
        try:
            for response in responses:
                if response.canceled or response.compact_revision:
                    return  # refused, or compacted: read the queue again
                if response.created:
                    if int(response.header.revision) > read_at:
                        now = self.position(ticket)
                        if now.held or now.gone or now.ahead != position.ahead:
                            return
                    continue
                if response.events:
                    return
        except grpc.RpcError as e:
            code = _code(e)
            details = _details(e)
            timed_out = timeout is not None and _clock.now() - started >= timeout - 0.05
            # Our deadline or cancel can surface as the server's own "context deadline exceeded/canceled" (UNKNOWN).
            if (
                interrupt.fired
                or timed_out
                or code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
                or "context deadline exceeded" in details
                or "context canceled" in details
            ):
                return
            if code in _RETRYABLE:
                # The member went away mid-watch. Pause briefly so a dead cluster is not spun on; the caller's
                # next read retries across endpoints and raises if the cluster stays away.
                pause = 0.05 if timeout is None else min(0.05, max(timeout - (_clock.now() - started), 0))
                time.sleep(pause)
                return
            if _is_expired_token(e) and self._username is not None:
                self._authenticate(_clock.now() + self.request_timeout)
                return
            raise self._translate(e, f"watch for lock {ticket.name!r}") from e
        finally:
            unregister()
            responses.cancel()

    def dequeue(self, ticket: Ticket) -> bool:
        request = etcdrpc.TxnRequest(
            compare=[
                etcdrpc.Compare(
                    result=etcdrpc.Compare.EQUAL,
                    target=etcdrpc.Compare.CREATE,
                    key=ticket.key,
                    create_revision=ticket.revision,
                )
            ],
            success=[etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=ticket.key))],
        )
        response, retried = self._unary(f"release lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded) or retried

    def holder(self, name: str) -> Holder | None:
        prefix = self._lock_prefix(name)
        request = etcdrpc.RangeRequest(
            key=prefix,
            range_end=_prefix_end(prefix),
            sort_order=etcdrpc.RangeRequest.ASCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=1,
        )
        response, _ = self._unary(f"read holder of lock {name!r}", "Range", request)
        if not response.kvs:
            return None
        kv = response.kvs[0]
        return Holder(
            name=name,
            token=int(kv.create_revision),
            lease_id=int(kv.lease),
            owner=owner_id(bytes(kv.value)),
            waiters=int(response.count) - 1,
        )

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order, and their leases' time left."""
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=_prefix_end(self._prefix))
        response, _ = self._unary("inspect locks", "Range", request)
        queues: dict[str, list[Any]] = {}
        for kv in response.kvs:
            escaped = bytes(kv.key)[len(self._prefix) :].split(b"/", 1)[0].decode("utf-8")
            queues.setdefault(unescape_name(escaped), []).append(kv)
        ttl_left: dict[int, float | None] = {}
        for kvs in queues.values():
            for kv in kvs:
                lease = int(kv.lease)
                if lease and lease not in ttl_left:
                    answer, _ = self._unary("read lease", "LeaseTimeToLive", etcdrpc.LeaseTimeToLiveRequest(ID=lease))
                    ttl_left[lease] = float(answer.TTL) if answer.TTL >= 0 else None
        states = []
        for name in sorted(queues):
            waiters = tuple(
                Waiter(
                    owner=owner_id(bytes(kv.value)),
                    token=int(kv.create_revision),
                    lease_id=int(kv.lease),
                    ttl_left=ttl_left.get(int(kv.lease)),
                )
                for kv in sorted(queues[name], key=lambda kv: int(kv.create_revision))
            )
            states.append(LockState(name=name, holder=waiters[0], waiters=waiters[1:]))
        return states


def _code(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    result = code() if callable(code) else None
    return result if isinstance(result, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _details(error: grpc.RpcError) -> str:
    details = getattr(error, "details", None)
    text = details() if callable(details) else None
    return str(text) if text else str(error)


def _closed_channel(error: ValueError) -> bool:
    """Whether grpc refused a request because another thread's close() shut the channel under it."""
    return "closed channel" in str(error)


def _is_expired_token(error: grpc.RpcError) -> bool:
    return "invalid auth token" in _details(error)
