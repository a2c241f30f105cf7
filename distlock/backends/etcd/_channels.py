"""The connection to an etcd cluster: one gRPC channel per member, the member requests go to, and the retry loop.

``Channels`` opens a channel to every member on first use and sends each request to one preferred member. An
UNAVAILABLE answer, or (with several members) an attempt that takes longer than its share of the request's time,
moves the preference to the member whose last failure is the oldest and retries there, until ``request_timeout``.
Every request sent through it must be safe to send twice (why each one is: ``Channels.retrying``). It logs in with
the URL's user and renews an expired auth token once per request, and turns gRPC errors into distlock's.

What can go wrong: no member answers in time (``BackendUnavailable``, naming the endpoints); bad credentials, or a
cluster with authentication and no user in the URL (``AuthenticationFailed``); a lease the server no longer knows
(``LeaseGone``); a request after ``close()``, or racing it in another thread (``ClientClosed``); an unreadable TLS
file (``ConfigurationError``). How failover behaves: docs/operations/etcd.md. Only ``_backend`` imports this module,
after checking that the ``etcd`` extra is installed.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from etcd3 import etcdrpc

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ClientClosed, ConfigurationError
from ..._protocol import LeaseGone
from ..._retry import Attempt, ErrorTable, retrying

__all__ = ["FIRST_ATTEMPT", "RETRYABLE", "Channels", "Member", "TLSConfig", "closed_channel", "details_of", "status_of"]

_R = TypeVar("_R")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
#: With several members: an attempt of a request may take this long before the next member is tried, once on each
#: member; each further round over the members may take twice as long as the one before (so a cluster that is only
#: slow still answers). etcd answers in milliseconds; a member that needs this long is frozen, cut off, or waiting
#: for an election, and another member may answer sooner.
FIRST_ATTEMPT = 0.5
#: With several members: the longest pause between two attempts. An election answers "no leader" quickly and ends
#: in about an election timeout; a long pause would only delay the first attempt after it.
_MAX_BACKOFF = 0.1


class Member:
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
    return isinstance(error, _AttemptTimedOut) or (isinstance(error, grpc.RpcError) and status_of(error) in RETRYABLE)


def _timed_out(error: grpc.RpcError) -> bool:
    # A deadline that runs out inside etcd comes back as UNKNOWN "context deadline exceeded".
    return status_of(error) == grpc.StatusCode.DEADLINE_EXCEEDED or "context deadline exceeded" in details_of(error)


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


def _format_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def status_of(error: grpc.RpcError) -> grpc.StatusCode:
    method = getattr(error, "code", None)
    result = method() if callable(method) else None
    return result if isinstance(result, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def details_of(error: grpc.RpcError) -> str:
    method = getattr(error, "details", None)
    text = method() if callable(method) else None
    return str(text) if text else str(error)


def closed_channel(error: ValueError) -> bool:
    """Whether grpc refused a request because another thread's close() shut the channel under it."""
    return "closed channel" in str(error)


def _is_expired_token(error: grpc.RpcError) -> bool:
    return "invalid auth token" in details_of(error)


class Channels:
    """One etcd cluster's members, the one requests go to now, and requests with retries. Thread-safe.

    One gRPC channel per member, and one *preferred* member that every request goes to. A request that the member
    does not answer in time, or answers with UNAVAILABLE (down, restarting, no leader, leader changed), moves the
    preference to the next member and is retried there: with several members, an attempt may take at most
    ``FIRST_ATTEMPT`` s, doubling on each round, so a frozen or cut-off member costs about half a second, not the
    whole ``request_timeout``. (One channel balancing over every member would keep sending a share of requests to
    the member that hangs.) With a single endpoint there is nowhere to move, and an attempt may use the whole
    request's time.
    """

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        tls: TLSConfig | None,
        username: str | None,
        password: str | None,
        request_timeout: float,
    ) -> None:
        self.endpoints = endpoints
        self._credentials = tls.credentials() if tls is not None else None
        self._username = username
        self._password = password
        self.request_timeout = request_timeout
        where = ",".join(_format_host(h, p) for h, p in endpoints)
        self.description = f"etcd at {where}"
        self._mutex = threading.Lock()
        self._members: list[Member] = []
        # Clients start on different members, so that reads and watches spread over the cluster.
        self._preferred = random.randrange(len(endpoints))
        self._abandoned: list[grpc.Channel] = []
        self._auth_token: str | None = None
        self._closed = False
        self._errors = ErrorTable(
            description=self.description,
            retryable=_retryable,
            translate=self.translate,
            recover=self.recover,
        )

    @staticmethod
    def _channel_options() -> list[tuple[str, Any]]:
        return [
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            # No grpc.min_reconnect_backoff_ms: gRPC takes it as the deadline of each connection attempt too, and
            # grpcio before 1.80 then never reconnected to an etcd stopped and started again on its port (without
            # it: within ~10 s there; at once on 1.80+, the floor of the etcd extra).
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 1_000),
            ("grpc.enable_retries", 0),
        ]

    def member(self) -> Member:
        """The member requests go to now (opening the channels on first use)."""
        with self._mutex:
            if self._closed:
                raise ClientClosed(f"the distlock client for {self.description} is closed")
            if not self._members:
                for host, port in self.endpoints:
                    target = _format_host(host, port)
                    options = self._channel_options()
                    if self._credentials is not None:
                        channel = grpc.secure_channel(target, self._credentials, options=options)
                    else:
                        channel = grpc.insecure_channel(target, options=options)
                    self._members.append(Member(target, channel))
            return self._members[self._preferred % len(self._members)]

    def fail_over(self, member: Member) -> None:
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
        count = len(self.endpoints)
        if count == 1:
            return None
        # Attempts 1..count: one short try on each member; the next round doubles. Doubling at every attempt instead
        # gave the second member twice the first's time although it is as likely to be the one cut off: after a
        # leader kill, a follower still forwarding to the dead leader held a request for a whole second.
        return lambda number: FIRST_ATTEMPT * 2 ** ((number - 1) // count)

    def metadata(self, *, require_leader: bool = False) -> tuple[tuple[str, str], ...] | None:
        token = self._auth_token
        pairs = ((("token", token),) if token is not None else ()) + (
            (("hasleader", "true"),) if require_leader else ()
        )
        return pairs or None

    def authenticate(self, deadline: float) -> None:
        if self._username is None:
            return
        request = etcdrpc.AuthenticateRequest(name=self._username, password=self._password)

        def call(member: Member, timeout: float) -> Any:
            return etcdrpc.AuthStub(member.channel).Authenticate(request, timeout=timeout)

        response, _ = self.retrying("authenticate", call, deadline)
        self._auth_token = str(response.token)

    def after_fork(self) -> None:
        # The parent's channels and their threads are not ours: keep references (so no finaliser touches them in the
        # child) and open new channels on first use.
        self._mutex = threading.Lock()
        self._abandoned.extend(member.channel for member in self._members)
        self._members = []

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            members, self._members = self._members, []
        for member in members:
            member.channel.close()

    # -- request plumbing -------------------------------------------------------------------------------------

    def retrying(self, what: str, call: Callable[[Member, float], _R], deadline: float) -> tuple[_R, int]:
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
            member = self.member()
            try:
                return call(member, attempt.timeout)
            except ValueError as e:
                if not closed_channel(e):
                    raise
                raise ClientClosed(f"{what}: the distlock client for {self.description} is closed") from e
            except grpc.RpcError as e:
                cut_short = attempt.deadline < deadline - 0.001
                if cut_short and _timed_out(e):
                    self.fail_over(member)
                    raise _AttemptTimedOut(member.address) from e
                if status_of(e) in RETRYABLE:
                    self.fail_over(member)
                raise

        budget = self._attempt_budget()
        if budget is None:
            return retrying(what, attempt, deadline, self._errors)
        return retrying(what, attempt, deadline, self._errors, budget, max_backoff=_MAX_BACKOFF)

    def recover(self, error: Exception, deadline: float) -> bool:
        """An expired auth token: authenticate again and retry at once."""
        if isinstance(error, grpc.RpcError) and _is_expired_token(error) and self._username is not None:
            self.authenticate(deadline)
            return True
        return False

    def unary(self, what: str, method: str, request: Any, *, budget: float | None = None) -> tuple[Any, bool]:
        """One unary request with retries; returns the response and whether an earlier attempt may have landed."""
        deadline = _clock.now() + (self.request_timeout if budget is None else budget)
        stub = "kv" if method in ("Txn", "Range") else "lease"

        def call(member: Member, timeout: float) -> Any:
            return getattr(getattr(member, stub), method)(request, timeout=timeout, metadata=self.metadata())

        response, attempts = self.retrying(what, call, deadline)
        return response, attempts > 1

    def translate(self, error: Exception, what: str) -> BackendError | None:
        if isinstance(error, _AttemptTimedOut):
            return BackendUnavailable(f"{what}: {self.description} did not answer in time (last tried: {error})")
        if not isinstance(error, grpc.RpcError):
            return None
        code = status_of(error)
        details = details_of(error)
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
