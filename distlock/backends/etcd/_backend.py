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
place again before it blocks, so no deletion between the read and the watch goes unseen. Once the watch reports the
deletion, the waiter reads its place (its own key, and whatever is still ahead) from the member that reported it, in
that member's own copy of the store: a copy that already holds the deletion, so the read needs no round through the
leader, and the caller is handed that read instead of making another.

Semaphores and read/write locks share the queue (``_shape`` has the grant rule): their keys start with their kind,
``<kind>.<lease hex>-<nonce>``. A writer waits like a lock's waiter; a reader reads, and watches, only the newest
writer ahead of it (the ``w.`` keys); a semaphore waiter has no single key to wait on and watches the whole queue
for deletions (see ``wait``). A queue holds one family of kinds: the join's transaction puts its key only if no key
of another family is in the queue (a compare over each range where such keys live), so a join of another kind
raises ``LockKindMismatch`` having put nothing, however many join at once (see ``enqueue``).

A lock's record (``write_record``) is the key ``<prefix>/<escaped name>``, beside its queue and outside every
range read: a transaction puts it only while the writer's own queue key still has its create revision.

What can go wrong: any member may be unreachable, frozen, cut off from its quorum, restarting, or between leaders.
Every request goes to one preferred member; an UNAVAILABLE answer or (with several members) an attempt that takes
longer than half a second moves the preference to another member and retries there (half a second on each member,
then twice as long per round, with pauses of at most 0.1 s), until the request timeout; then
``BackendUnavailable`` names the endpoints. Why a retry is safe even when the first attempt may have landed is
explained at ``EtcdBackend._retrying``; a retried delete whose first attempt may have landed is
reported as done, not as "already gone". Watches require a leader and are probed for silence (see ``wait``), so a
waiter is never left on a member that cannot report the release. Keep-alives fail over like any request; the
session's lost-lock deadline still counts from the last keep-alive that succeeded, so failing over never makes a
lease look longer than it is. Bad credentials, or a cluster with authentication and no user in the URL, raise
``AuthenticationFailed``; an expired auth token is renewed once per request and the request sent again. A lease
the server no longer knows raises ``LeaseGone``, and the core starts a new session. A closed client raises
``ClientClosed``, also for a request that races ``close()`` in another thread.
"""

from __future__ import annotations

import contextlib
import functools
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ClientClosed, ConfigurationError
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
from ..._shape import MUTEX, READ, WRITE, family, kind_of, limit_of, lock_state, mismatch, waiting

try:
    import grpc
    from etcd3 import etcdrpc
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the etcd backend needs the 'etcd' extra: pip install 'distlock-fenced[etcd]' (grpcio, protobuf, python3-etcd3)"
    ) from _e

__all__ = ["EtcdBackend", "TLSConfig"]

_R = TypeVar("_R")

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
#: With several members: an attempt of a request may take this long before the next member is tried, once on each
#: member; each further round over the members may take twice as long as the one before (so a cluster that is only
#: slow still answers). etcd answers in milliseconds; a member that needs this long is frozen, cut off, or waiting
#: for an election, and another member may answer sooner.
_FIRST_ATTEMPT = 0.5
#: With several members: the longest pause between two attempts. An election answers "no leader" quickly and ends
#: in about an election timeout; a long pause would only delay the first attempt after it.
_MAX_BACKOFF = 0.1
#: The watchdog asks each watched member for a progress report this often, and cancels a watch whose member has
#: said nothing for ``_WATCH_SILENCE`` s.
_PROBE_EVERY = 0.2
_WATCH_SILENCE = 0.6


class _Member:
    """One etcd member: its channel and the service stubs on it."""

    def __init__(self, address: str, channel: grpc.Channel) -> None:
        self.address = address
        self.channel = channel
        self.kv: Any = etcdrpc.KVStub(channel)
        self.lease: Any = etcdrpc.LeaseStub(channel)
        self.watch: Any = etcdrpc.WatchStub(channel)
        #: When a request to this member last failed over (-inf: never).
        self.failed_at = -math.inf


class _AttemptTimedOut(Exception):
    """An attempt ran out of its own (shortened) time on one member; the request is retried on the next."""


def _retryable(error: Exception) -> bool:
    return isinstance(error, _AttemptTimedOut) or (isinstance(error, grpc.RpcError) and _code(error) in _RETRYABLE)


def _timed_out(error: grpc.RpcError) -> bool:
    # A deadline that runs out inside etcd comes back as UNKNOWN "context deadline exceeded".
    return _code(error) == grpc.StatusCode.DEADLINE_EXCEEDED or "context deadline exceeded" in _details(error)


class _Requests:
    """The request side of a watch stream: the create request, then whatever :meth:`send` adds, until
    :meth:`close`. gRPC reads it on a thread of its own, which ``close()`` lets end."""

    def __init__(self, first: Any) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._queue.put(first)

    def send(self, request: Any) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        request = self._queue.get()
        if request is None:
            self._queue.put(None)  # stays closed for any later read
            raise StopIteration
        return request


@dataclass(eq=False)
class _Watched:
    member: _Member
    responses: Any
    requests: _Requests
    heard: float
    probed: float


class _WatchDog:
    """Cancels watches whose member stopped answering (several members only).

    A frozen member keeps its TCP connections open and answers nothing: a watch on it would wait for a release it
    never reports, and gRPC's own keep-alive pings may not be sent more often than every few seconds (etcd refuses
    clients that ping faster). So one thread per client sends each watch a progress request (etcd answers it at
    once, from the member itself) every ``_PROBE_EVERY`` s, and cancels a watch that has heard nothing for
    ``_WATCH_SILENCE`` s, failing its member over. The thread runs only while there are watches.
    """

    def __init__(self, fail_over: Callable[[_Member], None]) -> None:
        self._fail_over = fail_over
        self._mutex = threading.Lock()
        self._watched: set[_Watched] = set()
        self._running = False

    def watch(self, member: _Member, responses: Any, requests: _Requests) -> _Watched:
        now = _clock.now()
        watched = _Watched(member, responses, requests, heard=now, probed=now)
        with self._mutex:
            self._watched.add(watched)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="distlock-etcd-watchdog", daemon=True).start()
        return watched

    def forget(self, watched: _Watched) -> None:
        with self._mutex:
            self._watched.discard(watched)

    def _run(self) -> None:
        progress = etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())
        while True:
            time.sleep(_PROBE_EVERY)
            with self._mutex:
                if not self._watched:
                    self._running = False
                    return
                watched = list(self._watched)
            now = _clock.now()
            for each in watched:
                if now - each.heard > _WATCH_SILENCE:
                    self.forget(each)
                    self._fail_over(each.member)
                    each.responses.cancel()
                elif now - each.probed >= _PROBE_EVERY:
                    each.probed = now
                    each.requests.send(progress)


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

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_cert, "CA certificate"),
            private_key=read(self.client_key, "client key"),
            certificate_chain=read(self.client_cert, "client certificate"),
        )


@dataclass(frozen=True)
class _EtcdPosition(Position):
    """A waiting position, with the store ``revision`` it was read at: ``wait()`` compares its watch's start to it."""

    revision: int = 0


class _SlotWatch:
    """A semaphore waiter's watch on its queue: counts the deletions of keys ahead of it, and reads its place again
    once fewer than its limit can be ahead (or its own key went)."""

    def __init__(
        self, backend: EtcdBackend, member: _Member, ticket: Ticket, position: Position, read_at: int, limit: int
    ) -> None:
        self._backend = backend
        self._member = member
        self._ticket = ticket
        self._ahead = position.waiters_ahead if position.waiters_ahead >= 0 else limit
        self._read_at = read_at
        self._limit = limit

    def __call__(self, response: Any) -> Position | bool | None:
        if response.created:
            if int(response.header.revision) <= self._read_at:
                return False
            return self._read()
        for event in response.events:
            # Deletions the last read already counted (it may be newer than the watch's start) are skipped.
            if int(event.kv.mod_revision) <= self._read_at:
                continue
            if bytes(event.kv.key) == self._ticket.key or not event.HasField("prev_kv"):
                return self._backend._position_on(self._member, self._ticket)
            if int(event.prev_kv.create_revision) < self._ticket.token:
                self._ahead -= 1
        return self._read() if self._ahead < self._limit else False

    def _read(self) -> Position | bool:
        now = self._backend._position_on(self._member, self._ticket)
        if now.held or now.gone or not isinstance(now, _EtcdPosition):
            return now
        self._ahead, self._read_at = now.waiters_ahead, now.revision
        return False


def _none_at(key: bytes, range_end: bytes = b"") -> Any:
    """The compare of a transaction that acts only if no key ``key`` exists (with ``range_end``: no key in
    ``[key, range_end)``; etcd holds a compare over a range when every key in it passes, so an empty range passes)."""
    return etcdrpc.Compare(
        result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, key=key, range_end=range_end, create_revision=0
    )


def _still_there(ticket: Ticket) -> Any:
    """The compare of a transaction that acts only if ``ticket``'s key still exists, made by the same join."""
    return etcdrpc.Compare(
        result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, key=ticket.key, create_revision=ticket.token
    )


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

    unsupported: Mapping[str, str] = MappingProxyType({})  # every capability

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
        # The URL's grammar (``_url.parse``) checked the endpoints, the credentials and the TLS files' pairing.
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
        self._members: list[_Member] = []
        # Clients start on different members, so that reads and watches spread over the cluster.
        self._preferred = random.randrange(len(endpoints))
        self._abandoned: list[grpc.Channel] = []
        self._auth_token: str | None = None
        self._closed = False
        self._watchdog = _WatchDog(self._fail_over)
        self._errors = ErrorTable(
            description=self.description,
            retryable=_retryable,
            translate=self._translate,
            recover=self._recover,
        )

    # -- connection -------------------------------------------------------------------------------------------
    #
    # One gRPC channel per member, and one *preferred* member that every request goes to. A request that the member
    # does not answer in time, or answers with UNAVAILABLE (down, restarting, no leader, leader changed), moves the
    # preference to the next member and is retried there: with several members, an attempt may take at most
    # ``_FIRST_ATTEMPT`` s, doubling on each retry, so a frozen or cut-off member costs about half a second, not the
    # whole ``request_timeout``. (One channel balancing over every member would keep sending a share of requests to
    # the member that hangs.) With a single endpoint there is nowhere to move, and an attempt may use the whole
    # request's time, as before.

    @staticmethod
    def _channel_options() -> list[tuple[str, Any]]:
        return [
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.enable_retries", 0),
        ]

    def _member(self) -> _Member:
        """The member requests go to now (opening the channels on first use)."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            if not self._members:
                for host, port in self._endpoints:
                    target = _format_host(host, port)
                    options = self._channel_options()
                    if self._credentials is not None:
                        channel = grpc.secure_channel(target, self._credentials, options=options)
                    else:
                        channel = grpc.insecure_channel(target, options=options)
                    self._members.append(_Member(target, channel))
            return self._members[self._preferred % len(self._members)]

    def _fail_over(self, member: _Member) -> None:
        """``member`` did not answer: prefer another, unless another request has moved on already.

        The next preference is the member whose last failure is the oldest (one that never failed first, in ring
        order). Plain rotation would come back to a frozen member as soon as a second member timed out during the
        election the freeze caused, and that attempt, with its doubled budget, would wait on the frozen one again:
        0.5 + 1 + 2 s without a grant.
        """
        with self._mutex:
            if not self._members or self._members[self._preferred % len(self._members)] is not member:
                return
            now = _clock.now()
            member.failed_at = now
            count = len(self._members)
            if count == 1:
                return
            candidates = [(self._preferred + step) % count for step in range(1, count)]
            self._preferred = min(candidates, key=lambda i: self._members[i].failed_at)

    def _attempt_budget(self) -> Callable[[int], float] | None:
        count = len(self._endpoints)
        if count == 1:
            return None
        # Attempts 1..count: one short try on each member; the next round doubles. Doubling at every attempt instead
        # gave the second member twice the first's time although it is as likely to be the one cut off: after a
        # leader kill, a follower still forwarding to the dead leader held a request for a whole second.
        return lambda number: _FIRST_ATTEMPT * 2 ** ((number - 1) // count)

    def _metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...] | None:
        token = self._auth_token
        pairs = ((("token", token),) if token is not None else ()) + (
            (("hasleader", "true"),) if require_leader else ()
        )
        return pairs or None

    def _authenticate(self, deadline: float) -> None:
        if self._username is None:
            return
        request = etcdrpc.AuthenticateRequest(name=self._username, password=self._password)

        def call(member: _Member, timeout: float) -> Any:
            return etcdrpc.AuthStub(member.channel).Authenticate(request, timeout=timeout)

        response, _ = self._retrying("authenticate", call, deadline)
        self._auth_token = str(response.token)

    def after_fork(self) -> None:
        # The parent's channels and their threads are not ours: keep references (so no finaliser touches them in the
        # child) and open new channels on first use.
        self._mutex = threading.Lock()
        self._abandoned.extend(member.channel for member in self._members)
        self._members = []
        self._watchdog = _WatchDog(self._fail_over)

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            members, self._members = self._members, []
        for member in members:
            member.channel.close()

    # -- request plumbing -------------------------------------------------------------------------------------

    def _retrying(self, what: str, call: Callable[[_Member, float], _R], deadline: float) -> tuple[_R, int]:
        """Run ``call(member, timeout)`` on the preferred member until one answers, failing over to the next member
        after an UNAVAILABLE answer or an attempt that ran out of time, with backoff, until ``deadline``; return the
        answer and the attempts made.

        Every request sent through here is safe to send twice, which is what makes an attempt whose outcome is
        unknown (the member died after applying it, or answered too late) safe to retry elsewhere: enqueue is a
        transaction guarded by ``create_revision(key) == 0`` (a second copy finds the key and reads it), release and
        cancel delete only ``if create_revision(key) == token``, reads and keep-alives change nothing, a revoke of
        a lease that is gone is not an error. The exception is a lease grant: a grant that landed but whose answer
        was lost leaves an unused lease that carries no key and expires after its TTL.
        """

        def attempt(attempt: Attempt) -> _R:
            member = self._member()
            try:
                return call(member, attempt.timeout)
            except ValueError as e:
                if not _closed_channel(e):
                    raise
                raise ClientClosed(f"{what}: the distlock client for {self.description} is closed") from e
            except grpc.RpcError as e:
                cut_short = attempt.deadline < deadline - 0.001
                if cut_short and _timed_out(e):
                    self._fail_over(member)
                    raise _AttemptTimedOut(member.address) from e
                if _code(e) in _RETRYABLE:
                    self._fail_over(member)
                raise

        budget = self._attempt_budget()
        if budget is None:
            return retrying(what, attempt, deadline, self._errors)
        return retrying(what, attempt, deadline, self._errors, budget, max_backoff=_MAX_BACKOFF)

    def _recover(self, error: Exception, deadline: float) -> bool:
        """An expired auth token: authenticate again and retry at once."""
        if isinstance(error, grpc.RpcError) and _is_expired_token(error) and self._username is not None:
            self._authenticate(deadline)
            return True
        return False

    def _unary(self, what: str, method: str, request: Any, *, budget: float | None = None) -> tuple[Any, bool]:
        """One unary request with retries; returns the response and whether an earlier attempt may have landed."""
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)
        stub = "kv" if method in ("Txn", "Range") else "lease"

        def call(member: _Member, timeout: float) -> Any:
            return getattr(getattr(member, stub), method)(request, timeout=timeout, metadata=self._metadata())

        response, attempts = self._retrying(what, call, deadline)
        return response, attempts > 1

    def _translate(self, error: Exception, what: str) -> BackendError | None:
        if isinstance(error, _AttemptTimedOut):
            return BackendUnavailable(f"{what}: {self.description} did not answer in time (last tried: {error})")
        if not isinstance(error, grpc.RpcError):
            return None
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
        self._authenticate(deadline)
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=_prefix_end(self._prefix), count_only=True)
        try:
            self._unary("connect", "Range", request, budget=max(deadline - _clock.now(), 0.001))
        except BackendUnavailable as e:
            hint = f"is etcd running there? ({e})"
            raise BackendUnavailable(unreachable(self.description, self.connect_timeout, hint)) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        response, _ = self._unary("grant lease", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=math.ceil(ttl)))
        if response.error:
            raise BackendError(f"grant lease failed on {self.description}: {response.error}")
        return Lease(id=int(response.ID), ttl=float(response.TTL))

    def keep_alive(self, lease: Lease, timeout: float) -> float:
        deadline = _clock.now() + min(timeout, self.request_timeout)

        def once(member: _Member, timeout: float) -> float:
            request = etcdrpc.LeaseKeepAliveRequest(ID=lease.id)
            responses = member.lease.LeaseKeepAlive(iter((request,)), timeout=timeout, metadata=self._metadata())
            try:
                for response in responses:
                    return float(response.TTL)
                return 0.0
            finally:
                responses.cancel()

        ttl, _ = self._retrying("lease keep-alive", once, deadline)
        return ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        with contextlib.suppress(LeaseGone):  # etcd deletes the lease's keys with it: ``tickets`` are not needed
            self._unary("revoke lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease.id))

    def _lock_prefix(self, name: str) -> bytes:
        return self._prefix + escape_name(name).encode("utf-8") + b"/"

    def _key(self, name: str, lease_id: int, nonce: str) -> bytes:
        """The key a join makes: ``<lease hex>-<nonce>`` for a lock; for the other kinds the kind comes first,
        ``<kind>.<lease hex>-<rest>``, so that a read/write lock's writers share the range ``w.`` (a reader reads
        only the last writer ahead of it)."""
        kind = kind_of(nonce)
        if kind == MUTEX:
            return self._lock_prefix(name) + f"{lease_id:x}-{nonce}".encode("ascii")
        return self._lock_prefix(name) + f"{kind}.{lease_id:x}-{nonce.partition('.')[2]}".encode("ascii")

    def _kind(self, name: str, key: bytes) -> str:
        return kind_of(key[len(self._lock_prefix(name)) :].decode("ascii", "replace"))

    def _last_writer(self, name: str, before: int = 0, *, serializable: bool = False) -> Any:
        """A read of the newest writer of ``name``'s read/write lock (created before revision ``before``, if given)."""
        writers = self._lock_prefix(name) + WRITE.encode() + b"."
        return etcdrpc.RangeRequest(
            key=writers,
            range_end=_prefix_end(writers),
            max_create_revision=max(before - 1, 0),
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=1,
            keys_only=True,
            serializable=serializable,
        )

    @staticmethod
    def _placed(kind: str, wait_on: bytes | None, waiters_ahead: int, revision: int) -> Position:
        """A position by the grant rule: ``wait_on`` is the conflicting key to wait on (None: nothing conflicting
        ahead); a semaphore holds while fewer than its limit are ahead, and waits on no single key."""
        if kind.startswith("s"):
            if waiters_ahead < limit_of(kind):
                return Position(held=True, waiters_ahead=waiters_ahead)
            return _EtcdPosition(held=False, revision=revision, waiters_ahead=waiters_ahead)
        if wait_on is None:
            return Position(held=True, waiters_ahead=0)
        return _EtcdPosition(held=False, ahead=wait_on, revision=revision, waiters_ahead=waiters_ahead)

    def _other_families(self, name: str, kind: str) -> list[tuple[bytes, bytes]]:
        """The key ranges of ``name``'s queue that hold the keys of every family but ``kind``'s (``_shape.family``).

        A key's kind is the start of its name (``_key``): ``r.`` and ``w.`` a read/write lock's, ``s<N>.`` a
        semaphore's of limit N, anything else a lock's (its lease's hex digits). So for a read/write lock or a
        semaphore the other families are everything outside its own prefixes: the gaps around them. For a lock they
        are ``r.``, ``w.`` and ``s`` followed by a digit.
        """
        prefix = self._lock_prefix(name)

        def starting(tail: str) -> tuple[bytes, bytes]:
            start = prefix + tail.encode("ascii")
            return start, _prefix_end(start)

        if family(kind) == MUTEX:
            return [starting(f"{READ}."), starting(f"{WRITE}."), (prefix + b"s0", prefix + b"s:")]
        ours = [starting(f"{each}.") for each in ((READ, WRITE) if family(kind) == family(READ) else (kind,))]
        gaps, start = [], prefix
        for low, high in ours:
            gaps.append((start, low))
            start = high
        gaps.append((start, _prefix_end(prefix)))
        return gaps

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        prefix = self._lock_prefix(name)
        end = _prefix_end(prefix)
        key = self._key(name, lease_id, nonce)
        kind = kind_of(nonce)
        # A queue holds one family of kinds (``_shape``), and the join itself keeps it so: the transaction puts our
        # key only if no key of another family is in the queue (one compare per range of theirs), in the same step.
        # Checked after the put, it raced. Ten semaphore slots joining a lock's name at once: the first finds the
        # lock's key just ahead and is refused, but its key stays until a second request removes it; the next join
        # finds that refused key just ahead, of its own kind, passes, and then counts the keys ahead of it without
        # their kind, fewer than its limit, and holds beside the lock's holder. Inside the transaction nothing comes
        # between the check and the put: a refused join puts nothing (nothing to remove, nobody to pass behind it),
        # and every key in a queue was put while the queue held its family only, so the positions below, which
        # count the keys ahead (a semaphore) or read the writers ahead (a reader), count within one family.
        others = self._other_families(name, kind)
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
            compare=[_none_at(key), *(_none_at(low, high) for low, high in others)],
            success=[
                etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=owner, lease=lease_id)),
                etcdrpc.RequestOp(request_range=newest_two),
                # A reader waits only for the last writer ahead of it (every writer there now is ahead of it).
                *([etcdrpc.RequestOp(request_range=self._last_writer(name))] if kind == READ else []),
            ],
            failure=[
                etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, keys_only=True)),
                *(
                    etcdrpc.RequestOp(
                        request_range=etcdrpc.RangeRequest(key=low, range_end=high, limit=1, keys_only=True)
                    )
                    for low, high in others
                ),
            ],
        )
        response, resent = self._unary(f"enqueue for lock {name!r}", "Txn", request)
        if not response.succeeded:
            kvs = response.responses[0].response_range.kvs
            if kvs:
                # A retry of a put that landed: the key is ours already (its join passed the same compares). Read
                # our place the ordinary way.
                ticket = Ticket(name=name, key=key, token=int(kvs[0].create_revision), lease_id=lease_id, resent=True)
                return ticket, self.position(ticket)
            for answer in response.responses[1:]:
                if answer.response_range.kvs:
                    raise mismatch(name, kind, self._kind(name, bytes(answer.response_range.kvs[0].key)))
            raise BackendError(f"enqueue for lock {name!r}: a compare failed on keys a transaction did not find")
        revision = int(response.header.revision)
        ticket = Ticket(name=name, key=key, token=revision, lease_id=lease_id, resent=resent)
        newest = response.responses[1].response_range
        ahead = [kv for kv in newest.kvs if kv.key != key]
        if kind == READ:
            writers = response.responses[2].response_range.kvs
            wait_on = bytes(writers[0].key) if writers else None
        else:
            wait_on = bytes(ahead[0].key) if ahead else None
        return ticket, self._placed(kind, wait_on, int(newest.count) - 1, revision)

    def position(self, ticket: Ticket) -> Position:
        # One plain Range, not a read-only Txn: etcd before 3.5.5 panics when a read-only Txn's context is cancelled
        # in flight (etcd-io/etcd#14110) -- a client closed or a deadline hit mid-read would take the member down.
        # A reader reads the last writer ahead first: none there stays true (later writers join behind us), so
        # finding our key afterwards proves we held at that later read.
        what = f"read queue of lock {ticket.name!r}"
        writers = None
        if self._kind(ticket.name, ticket.key) == READ:
            writers, _ = self._unary(what, "Range", self._last_writer(ticket.name, ticket.token))
        response, _ = self._unary(what, "Range", self._position_request(ticket, serializable=False))
        return self._position_of(ticket, response, writers)

    def _position_request(self, ticket: Ticket, *, serializable: bool) -> Any:
        # Create revisions in a queue are unique, so the newest key created at or before our ticket is our own key
        # (gone if it is someone else's), and the one after it in this order is the waiter just ahead of us. A
        # semaphore waiter needs the number ahead of it, which etcd's ``count`` does not give (it counts the whole
        # range, before the create-revision filter): it reads every key ahead (keys only).
        prefix = self._lock_prefix(ticket.name)
        return etcdrpc.RangeRequest(
            key=prefix,
            range_end=_prefix_end(prefix),
            max_create_revision=ticket.token,
            sort_order=etcdrpc.RangeRequest.DESCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=0 if self._kind(ticket.name, ticket.key).startswith("s") else 2,
            keys_only=True,
            serializable=serializable,
        )

    def _position_of(self, ticket: Ticket, response: Any, writers: Any = None) -> Position:
        kvs = response.kvs
        if not kvs or bytes(kvs[0].key) != ticket.key or int(kvs[0].create_revision) != ticket.token:
            return Position(held=False, gone=True)
        if writers is not None:
            wait_on = bytes(writers.kvs[0].key) if writers.kvs else None
        else:
            wait_on = bytes(kvs[1].key) if len(kvs) > 1 else None
        kind = self._kind(ticket.name, ticket.key)
        ahead = len(kvs) - 1 if kind.startswith("s") else int(response.count) - 1
        return self._placed(kind, wait_on, ahead, int(response.header.revision))

    def _position_on(self, member: _Member, ticket: Ticket) -> Position:
        """Where ``ticket`` stands in ``member``'s own copy of the store (a serializable read, no retries).

        The member whose watch has just reported a revision has applied everything up to it, so its copy is at least
        that new: what the read finds ahead of us was there at or after the event, and a key of ours deleted before
        it (a lease revoked behind our back) shows as gone. It saves the round of a linearizable read (on a cluster,
        the leader's confirmation from a quorum) on the path from a release to the next holder. Any failure falls
        back to the ordinary linearizable read, which retries across members.
        """
        budget = self.request_timeout if len(self._endpoints) == 1 else _FIRST_ATTEMPT
        try:
            writers = None
            if self._kind(ticket.name, ticket.key) == READ:
                request = self._last_writer(ticket.name, ticket.token, serializable=True)
                writers = member.kv.Range(request, timeout=budget, metadata=self._metadata())
            response = member.kv.Range(
                self._position_request(ticket, serializable=True), timeout=budget, metadata=self._metadata()
            )
        except (grpc.RpcError, ValueError):
            return self.position(ticket)
        return self._position_of(ticket, response, writers)

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        # Watch from "now", not from the read's revision + 1: etcd serves a watch that starts in the past from its
        # unsynced-watcher loop, every 100 ms, and under contention the revision has always moved on by the time
        # the watch is created. A deletion between our read and the watch's start would then go unseen, so when
        # the watch starts later than the read, we read the queue again (one more request) before waiting.
        #
        # A watch must not hang on a member that cannot tell us about the release: ``hasleader`` asks etcd to cancel
        # it when the member has no leader (cut off from the quorum; the Go client's WithRequireLeader), and with
        # several members the watchdog asks the member for a progress report every few hundred milliseconds and
        # cancels the watch when it stays silent (a frozen member answers nothing, not even a cancel). Either way
        # this returns, the member loses the preference, and the caller's next read goes to another member.
        #
        # A semaphore waiter has no single key to watch (any of the holders may go first): it watches the whole
        # queue for deletions, from the same "now", and counts those of keys ahead of it (the watch reports the
        # deleted key's create revision); it reads its place again only once fewer than its limit can be ahead.
        # Deletions behind it cost it a message each, no request.
        member = self._member()
        read_at = position.revision if isinstance(position, _EtcdPosition) else 0  # 0: always read again
        kind = self._kind(ticket.name, ticket.key)
        if kind.startswith("s"):
            prefix = self._lock_prefix(ticket.name)
            create = etcdrpc.WatchCreateRequest(
                key=prefix, range_end=_prefix_end(prefix), filters=[etcdrpc.WatchCreateRequest.NOPUT], prev_kv=True
            )
            handle: Callable[[Any], Position | bool | None] = _SlotWatch(
                self, member, ticket, position, read_at, limit_of(kind)
            )
        else:
            create = etcdrpc.WatchCreateRequest(key=position.ahead, filters=[etcdrpc.WatchCreateRequest.NOPUT])
            handle = functools.partial(self._ahead_watch, member, ticket, position, read_at)
        requests = _Requests(etcdrpc.WatchRequest(create_request=create))
        started = _clock.now()
        try:
            responses = member.watch.Watch(requests, timeout=timeout, metadata=self._metadata(require_leader=True))
        except ValueError as e:
            requests.close()
            if not _closed_channel(e):
                raise
            return None  # the caller's next read reports the closed client
        unregister = interrupt.on_fire(responses.cancel)
        watched = self._watchdog.watch(member, responses, requests) if len(self._endpoints) > 1 else None
        try:
            for response in responses:
                if watched is not None:
                    watched.heard = _clock.now()
                if response.canceled or response.compact_revision:
                    if response.canceled and "no leader" in response.cancel_reason:
                        self._fail_over(member)
                    return None  # refused, or compacted: read the queue again
                outcome = handle(response)
                if outcome is not False:
                    return outcome  # type: ignore[return-value]
        except grpc.RpcError as e:
            code = _code(e)
            details = _details(e)
            timed_out = timeout is not None and _clock.now() - started >= timeout - 0.05
            # Our deadline or cancel (the interrupt's, or the watchdog's for a silent member) can surface as the
            # server's own "context deadline exceeded/canceled" (UNKNOWN).
            if (
                interrupt.fired
                or timed_out
                or code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
                or "context deadline exceeded" in details
                or "context canceled" in details
            ):
                return None
            if code in _RETRYABLE:
                # The member went away mid-watch, or has no leader. Move on, and pause briefly so a dead cluster is
                # not spun on; the caller's next read retries across members and raises if the cluster stays away.
                self._fail_over(member)
                pause = 0.05 if timeout is None else min(0.05, max(timeout - (_clock.now() - started), 0))
                time.sleep(pause)
                return None
            if _is_expired_token(e) and self._username is not None:
                self._authenticate(_clock.now() + self.request_timeout)
                return None
            raise self._translate(e, f"watch for lock {ticket.name!r}") or e from e
        finally:
            if watched is not None:
                self._watchdog.forget(watched)
            unregister()
            responses.cancel()
            requests.close()
        return None  # the stream ended without an answer: read the queue again

    def _ahead_watch(
        self, member: _Member, ticket: Ticket, position: Position, read_at: int, response: Any
    ) -> Position | bool | None:
        """One answer of the watch on the key ahead: the position to return, or False to go on watching."""
        if response.created:
            if int(response.header.revision) > read_at:
                now = self._position_on(member, ticket)
                if now.held or now.gone or now.ahead != position.ahead:
                    return now
            return False
        if response.events:
            # The key ahead is gone: where do we stand now? Our own key is read again, too (a waiter whose lease was
            # revoked while it waited must not take its turn), in the copy of the member that reported the deletion.
            return self._position_on(member, ticket)
        return False

    def dequeue(self, ticket: Ticket) -> bool:
        request = etcdrpc.TxnRequest(
            compare=[_still_there(ticket)],
            success=[etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=ticket.key))],
        )
        response, retried = self._unary(f"release lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded) or retried

    def _read_head(self, name: str) -> Any:
        """A read of ``name``'s queue for its head: the oldest key (``kvs``, empty or one) and ``count``."""
        prefix = self._lock_prefix(name)
        request = etcdrpc.RangeRequest(
            key=prefix,
            range_end=_prefix_end(prefix),
            sort_order=etcdrpc.RangeRequest.ASCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=1,
        )
        response, _ = self._unary(f"read holder of lock {name!r}", "Range", request)
        return response

    def head(self, name: str) -> Head | None:
        response = self._read_head(name)
        if not response.kvs:
            return None
        kv = response.kvs[0]
        waiters = int(response.count) - 1  # a head that holds alone: every key behind it waits
        kind = self._kind(name, bytes(kv.key))
        if waiters and (kind == READ or limit_of(kind) > 1):
            # Slots of a semaphore, or readers, hold together: which of the keys wait is the grant rule's to say,
            # over the kinds of the whole queue (keys only), read at the revision the head was read at.
            prefix = self._lock_prefix(name)
            request = etcdrpc.RangeRequest(
                key=prefix,
                range_end=_prefix_end(prefix),
                revision=int(response.header.revision),
                sort_order=etcdrpc.RangeRequest.ASCEND,
                sort_target=etcdrpc.RangeRequest.CREATE,
                keys_only=True,
            )
            queue, _ = self._unary(f"read queue of lock {name!r}", "Range", request)
            waiters = waiting([self._kind(name, bytes(each.key)) for each in queue.kvs])
        token, lease_id = int(kv.create_revision), int(kv.lease)
        holder = Holder(
            name=name,
            token=token,
            lease_id=lease_id,
            owner=owner_id(bytes(kv.value)),
            waiters=waiters,
            holders=int(response.count) - waiters,
        )
        return Head(Ticket(name=name, key=bytes(kv.key), token=token, lease_id=lease_id), holder)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        key = self._key(name, lease.id, nonce)
        response, _ = self._unary(f"look for a late join of lock {name!r}", "Range", etcdrpc.RangeRequest(key=key))
        if not response.kvs:
            return None
        token = int(response.kvs[0].create_revision)
        self.dequeue(Ticket(name=name, key=key, token=token, lease_id=lease.id))
        return token

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One LeaseTimeToLive with keys=True names every key on the lease (waiters' too), whatever the number of
        # locks held: cheaper than a read per lock. A key name is never reused (each joins with a fresh nonce), so
        # a held key that is not on its lease any more was deleted.
        if not tickets:
            return []
        lease_id = tickets[0].lease_id
        request = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        answer, _ = self._unary("check held locks", "LeaseTimeToLive", request)
        if answer.TTL < 0:  # -1: not found (0 is a live lease with less than a second left)
            raise LeaseGone(f"check held locks: lease {lease_id:x} is gone on {self.description}")
        present = {bytes(key) for key in answer.keys}
        return [ticket for ticket in tickets if ticket.key not in present]

    def _record_key(self, name: str) -> bytes:
        """``<prefix>/<escaped name>``: beside the lock's queue (``<prefix>/<escaped name>/``), never inside a range."""
        return self._lock_prefix(name)[:-1]

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        # The compare is a release's: the ticket's key still exists with its revision. A key is deleted when its
        # lease runs out, so a holder frozen past its TTL finds its write refused even before anyone else holds.
        request = etcdrpc.TxnRequest(
            compare=[_still_there(ticket)],
            success=[etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=self._record_key(ticket.name), value=value))],
        )
        response, _ = self._unary(f"write the record of lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded)

    def read_record(self, name: str) -> bytes | None:
        request = etcdrpc.RangeRequest(key=self._record_key(name))
        response, _ = self._unary(f"read the record of lock {name!r}", "Range", request)
        return bytes(response.kvs[0].value) if response.kvs else None

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order, and their leases' time left."""
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=_prefix_end(self._prefix))
        response, _ = self._unary("inspect locks", "Range", request)
        queues: dict[str, list[Any]] = {}
        for kv in response.kvs:
            escaped, slash, _ = bytes(kv.key)[len(self._prefix) :].partition(b"/")
            if slash:  # a queue entry; ``<prefix>/<escaped name>`` alone is the lock's record
                queues.setdefault(unescape_name(escaped.decode("utf-8")), []).append(kv)
        ttl_left: dict[int, float | None] = {}
        for kvs in queues.values():
            for kv in kvs:
                lease = int(kv.lease)
                if lease and lease not in ttl_left:
                    answer, _ = self._unary("read lease", "LeaseTimeToLive", etcdrpc.LeaseTimeToLiveRequest(ID=lease))
                    ttl_left[lease] = float(answer.TTL) if answer.TTL >= 0 else None
        states = []
        for name in sorted(queues):
            kvs = sorted(queues[name], key=lambda kv: int(kv.create_revision))
            entries = [
                Waiter(
                    owner=owner_id(bytes(kv.value)),
                    token=int(kv.create_revision),
                    lease_id=int(kv.lease),
                    ttl_left=ttl_left.get(int(kv.lease)),
                )
                for kv in kvs
            ]
            states.append(lock_state(name, entries, [self._kind(name, bytes(kv.key)) for kv in kvs]))
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
