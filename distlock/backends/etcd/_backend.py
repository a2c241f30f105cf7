"""The etcd backend: the primitives of ``_protocol.Backend`` over etcd's v3 gRPC API.

It talks gRPC itself through ``grpcio`` (``_channels``) and takes only the generated protobuf messages and service stubs
from ``python3-etcd3`` (``etcd3.etcdrpc``); every request is built from messages. The queue is etcd's Go
``concurrency.Mutex``: each join puts a key ``<prefix>/<escaped name>/[<kind>.]<lease hex>-<seat>`` on its lease (a seat
is reused from one acquisition to the next, so a lock's range holds few key names however often it is taken:
``Keeper.join_started``), the oldest create revision holds and is the token, and a waiter watches only the key it waits
on (``_watch``); the grant rule of semaphores and read/write locks is ``_shape``'s. A join's transaction puts its key
only if no key of another family is queued, so a join of another kind raises ``LockKindMismatch`` having put nothing. A
record (``write_record``) is the key ``<prefix>/<escaped name>``, put only while the writer's key keeps its revision;
a mark (``write_mark``) is ``<prefix>/<escaped name>%m<escaped key>``, put so too, on a lease that expires it
(``_marks``): outside every lock's range (``%m`` is in no escaped name), and a listing skips it as it skips a record.
The key layout, the races and why each step is safe: docs/operations/etcd.md ("How it works").

What can go wrong: members unreachable, frozen or between leaders (retried on another member, then
``BackendUnavailable``); bad or missing credentials (``AuthenticationFailed``); a lease the server no longer knows
(``LeaseGone``: the core starts a new session); a closed client (``ClientClosed``); a join onto another kind
(``LockKindMismatch``). A retried delete whose first attempt may have landed is reported as done.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from ... import _clock
from ..._errors import BackendError, BackendUnavailable, ConfigurationError
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
from ..._shape import MUTEX, READ, WRITE, family, kind_of, limit_of, lock_state, mismatch, waiting

try:
    import grpc
    from etcd3 import etcdrpc
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "the etcd backend needs the 'etcd' extra: pip install 'distlock-fenced[etcd]' (grpcio, protobuf, python3-etcd3)"
    ) from _e

from ._channels import FIRST_ATTEMPT, Channels, Member, TLSConfig
from ._marks import MarkLeases
from ._watch import Handler, PositionAtRevision, SemaphoreWatch, Watches, ahead_watch

__all__ = ["EtcdBackend", "prefix_end"]


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


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix`` (etcd's range_end for a prefix)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


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
        self._prefix = prefix.encode("utf-8") + b"/"
        self.connect_timeout = connect_timeout
        self._channels = Channels(
            endpoints, tls=tls, username=username, password=password, request_timeout=request_timeout
        )
        self.description = self._channels.description
        self._watches = Watches(self._channels)
        self._mark_leases = MarkLeases(self.grant_lease)

    def after_fork(self) -> None:
        self._channels.after_fork()
        self._watches.after_fork()

    def close(self) -> None:
        self._channels.close()

    def check(self) -> None:
        deadline = _clock.now() + self.connect_timeout
        self._channels.authenticate(deadline)
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=prefix_end(self._prefix), count_only=True)
        try:
            self._channels.unary("connect", "Range", request, budget=max(deadline - _clock.now(), 0.001))
        except BackendUnavailable as e:
            hint = f"is etcd running there? ({e})"
            raise BackendUnavailable(unreachable(self.description, self.connect_timeout, hint)) from e.__cause__

    def grant_lease(self, ttl: float) -> Lease:
        response, _ = self._channels.unary("grant lease", "LeaseGrant", etcdrpc.LeaseGrantRequest(TTL=math.ceil(ttl)))
        if response.error:
            raise BackendError(f"grant lease failed on {self.description}: {response.error}")
        return Lease(id=int(response.ID), ttl=float(response.TTL))

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        deadline = _clock.now() + min(timeout, self._channels.request_timeout)

        def once(member: Member, timeout: float) -> float:
            request = etcdrpc.LeaseKeepAliveRequest(ID=lease.id)
            responses = member.lease.LeaseKeepAlive(
                iter((request,)), timeout=timeout, metadata=self._channels.metadata()
            )
            try:
                for response in responses:
                    return float(response.TTL)
                return 0.0
            finally:
                responses.cancel()

        ttl, _ = self._channels.retrying("lease keep-alive", once, deadline)
        return ttl

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        with contextlib.suppress(LeaseGone):  # etcd deletes the lease's keys with it: ``tickets`` are not needed
            self._channels.unary("revoke lease", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease.id))

    def _lock_prefix(self, name: str) -> bytes:
        return self._prefix + escape_name(name).encode("utf-8") + b"/"

    def _key(self, name: str, lease_id: int, nonce: str) -> bytes:
        """The key a join makes: ``<lease hex>-<seat>`` for a lock; for the other kinds the kind comes first,
        ``<kind>.<lease hex>-<seat>``, so that a read/write lock's writers share the range ``w.`` (a reader reads
        only the last writer ahead of it). Clients before seats put 16 random hex digits where the seat is: the
        same ranges, the same order by create revision, so both queue together."""
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
            range_end=prefix_end(writers),
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
            return PositionAtRevision(held=False, revision=revision, waiters_ahead=waiters_ahead)
        if wait_on is None:
            return Position(held=True, waiters_ahead=0)
        return PositionAtRevision(held=False, ahead=wait_on, revision=revision, waiters_ahead=waiters_ahead)

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
            return start, prefix_end(start)

        if family(kind) == MUTEX:
            return [starting(f"{READ}."), starting(f"{WRITE}."), (prefix + b"s0", prefix + b"s:")]
        ours = [starting(f"{each}.") for each in ((READ, WRITE) if family(kind) == family(READ) else (kind,))]
        gaps, start = [], prefix
        for low, high in ours:
            gaps.append((start, low))
            start = high
        gaps.append((start, prefix_end(prefix)))
        return gaps

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        prefix = self._lock_prefix(name)
        end = prefix_end(prefix)
        key = self._key(name, lease_id, nonce)
        kind = kind_of(nonce)
        # A queue holds one family of kinds (``_shape``), and the join itself keeps it so: the transaction puts our
        # key only if no key of another family is in the queue (one compare per range of theirs). Checked after the
        # put, it raced (docs/operations/etcd.md, "How it works"). So every key in a queue was put while the queue
        # held its family only, and the positions below, which count the keys ahead (a semaphore) or read the
        # writers ahead (a reader), count within one family.
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
        response, resent = self._channels.unary(f"enqueue for lock {name!r}", "Txn", request)
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
            writers, _ = self._channels.unary(what, "Range", self._last_writer(ticket.name, ticket.token))
        response, _ = self._channels.unary(what, "Range", self._position_request(ticket, serializable=False))
        return self._position_of(ticket, response, writers)

    def _position_request(self, ticket: Ticket, *, serializable: bool) -> Any:
        # Create revisions in a queue are unique, so the newest key created at or before our ticket is our own key
        # (gone if it is someone else's), and the one after it in this order is the waiter just ahead of us. A
        # semaphore waiter needs the number ahead of it, which etcd's ``count`` does not give (it counts the whole
        # range, before the create-revision filter): it reads every key ahead (keys only).
        prefix = self._lock_prefix(ticket.name)
        return etcdrpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
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

    def _position_on(self, member: Member, ticket: Ticket) -> Position:
        """Where ``ticket`` stands in ``member``'s own copy of the store (a serializable read, no retries).

        The member whose watch has just reported a revision has applied everything up to it, so its copy is at least
        that new: what the read finds ahead of us was there at or after the event, and a key of ours deleted before
        it (a lease revoked behind our back) shows as gone. It saves the round of a linearizable read (on a cluster,
        the leader's confirmation from a quorum) on the path from a release to the next holder. Any failure falls
        back to the ordinary linearizable read, which retries across members.
        """
        budget = self._channels.request_timeout if len(self._channels.endpoints) == 1 else FIRST_ATTEMPT
        try:
            writers = None
            if self._kind(ticket.name, ticket.key) == READ:
                request = self._last_writer(ticket.name, ticket.token, serializable=True)
                writers = member.kv.Range(request, timeout=budget, metadata=self._channels.metadata())
            response = member.kv.Range(
                self._position_request(ticket, serializable=True), timeout=budget, metadata=self._channels.metadata()
            )
        except (grpc.RpcError, ValueError):
            return self.position(ticket)
        return self._position_of(ticket, response, writers)

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        # Watch from "now", not from the read's revision + 1 (etcd serves a watch that starts in the past only every
        # 100 ms): when the watch starts later than the read, the handler reads the queue again before waiting. A
        # semaphore waiter has no single key to watch: it watches the whole queue for deletions and counts those of
        # keys ahead of it. See docs/operations/etcd.md ("How it works").
        member = self._channels.member()
        read_at = position.revision if isinstance(position, PositionAtRevision) else 0  # 0: always read again
        read_place = functools.partial(self._position_on, member, ticket)
        kind = self._kind(ticket.name, ticket.key)
        handle: Handler
        if kind.startswith("s"):
            prefix = self._lock_prefix(ticket.name)
            create = etcdrpc.WatchCreateRequest(
                key=prefix, range_end=prefix_end(prefix), filters=[etcdrpc.WatchCreateRequest.NOPUT], prev_kv=True
            )
            handle = SemaphoreWatch(read_place, ticket, position, read_at, limit_of(kind))
        else:
            create = etcdrpc.WatchCreateRequest(key=position.ahead, filters=[etcdrpc.WatchCreateRequest.NOPUT])
            handle = functools.partial(ahead_watch, read_place, position, read_at)
        return self._watches.follow(member, create, handle, timeout, interrupt, f"watch for lock {ticket.name!r}")

    def watch_head(self, name: str, seen: Ticket | None, timeout: float, interrupt: Interrupt) -> None:
        # One watch on the lock's queue (its range, not the record beside it). The caller read the head before this
        # call, and a watch from "now" reports nothing that came before it: a holder deposed between that read and
        # the watch's start would go unseen until the next poll. So once etcd confirms the watch (its ``created``
        # answer: every later change is reported), the head is read again, and a head that is not ``seen`` returns
        # at once. While a head exists only a deletion can change it (a new key has a larger create revision and
        # queues behind), so puts are left out; with none, the first put is the news.
        prefix = self._lock_prefix(name)
        filters = [] if seen is None else [etcdrpc.WatchCreateRequest.NOPUT]
        create = etcdrpc.WatchCreateRequest(key=prefix, range_end=prefix_end(prefix), filters=filters)
        token = None if seen is None else seen.token

        def handle(response: Any) -> bool | None:
            if response.created:
                head = self.head(name)
                return False if (None if head is None else head.ticket.token) == token else None
            return None if response.events else False  # None: look again; False: watch on

        what = f"watch the head of lock {name!r}"
        self._watches.follow(self._channels.member(), create, handle, timeout, interrupt, what)

    def dequeue(self, ticket: Ticket) -> bool:
        request = etcdrpc.TxnRequest(
            compare=[_still_there(ticket)],
            success=[etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=ticket.key))],
        )
        response, retried = self._channels.unary(f"release lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded) or retried

    def _read_head(self, name: str) -> Any:
        """A read of ``name``'s queue for its head: the oldest key (``kvs``, empty or one) and ``count``."""
        prefix = self._lock_prefix(name)
        request = etcdrpc.RangeRequest(
            key=prefix,
            range_end=prefix_end(prefix),
            sort_order=etcdrpc.RangeRequest.ASCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
            limit=1,
        )
        response, _ = self._channels.unary(f"read holder of lock {name!r}", "Range", request)
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
                range_end=prefix_end(prefix),
                revision=int(response.header.revision),
                sort_order=etcdrpc.RangeRequest.ASCEND,
                sort_target=etcdrpc.RangeRequest.CREATE,
                keys_only=True,
            )
            queue, _ = self._channels.unary(f"read queue of lock {name!r}", "Range", request)
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
        # The keeper asks this only of a retired seat, which no join of ours takes again: a key found there is the
        # stray join's or its late copy's, never a live waiter's (docs/operations/etcd.md, "How it works").
        key = self._key(name, lease.id, nonce)
        response, _ = self._channels.unary(
            f"look for a late join of lock {name!r}", "Range", etcdrpc.RangeRequest(key=key)
        )
        if not response.kvs:
            return None
        token = int(response.kvs[0].create_revision)
        self.dequeue(Ticket(name=name, key=key, token=token, lease_id=lease.id))
        return token

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One LeaseTimeToLive with keys=True names every key on the lease (waiters' too), whatever the number of
        # locks held: cheaper than a read per lock. A held ticket keeps its seat, so no other join of ours makes its
        # key while it is held: a held key that is not on its lease any more was deleted.
        if not tickets:
            return []
        lease_id = tickets[0].lease_id
        request = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        answer, _ = self._channels.unary("check held locks", "LeaseTimeToLive", request)
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
        response, _ = self._channels.unary(f"write the record of lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded)

    def read_record(self, name: str) -> bytes | None:
        return self._get(f"read the record of lock {name!r}", self._record_key(name))

    def _mark_key(self, name: str, key: str) -> bytes:
        """``<prefix>/<escaped name>%m<escaped key>``: beside the record, in no lock's range (no ``/`` after the
        prefix), and no lock's record (an escaped name has ``%`` only before two hex digits)."""
        return self._record_key(name) + b"%m" + escape_name(key).encode("utf-8")

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        lease_id = self._mark_leases.lease_for(ttl)
        try:
            return self._put_mark(ticket, key, value, lease_id)
        except LeaseGone:  # revoked by hand, or gone with a restored snapshot: once more, on a new lease
            self._mark_leases.forget(lease_id)
            return self._put_mark(ticket, key, value, self._mark_leases.lease_for(ttl))

    def _put_mark(self, ticket: Ticket, key: str, value: bytes, lease_id: int) -> bool:
        # The compare of write_record; the put on a lease that expires the mark (``_marks``).
        put = etcdrpc.PutRequest(key=self._mark_key(ticket.name, key), value=value, lease=lease_id)
        request = etcdrpc.TxnRequest(compare=[_still_there(ticket)], success=[etcdrpc.RequestOp(request_put=put)])
        response, _ = self._channels.unary(f"write mark {key!r} of lock {ticket.name!r}", "Txn", request)
        return bool(response.succeeded)

    def read_mark(self, name: str, key: str) -> bytes | None:
        return self._get(f"read mark {key!r} of lock {name!r}", self._mark_key(name, key))

    def _get(self, what: str, key: bytes) -> bytes | None:
        response, _ = self._channels.unary(what, "Range", etcdrpc.RangeRequest(key=key))
        return bytes(response.kvs[0].value) if response.kvs else None

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order, and their leases' time left."""
        request = etcdrpc.RangeRequest(key=self._prefix, range_end=prefix_end(self._prefix))
        response, _ = self._channels.unary("inspect locks", "Range", request)
        queues: dict[str, list[Any]] = {}
        for kv in response.kvs:
            escaped, slash, _ = bytes(kv.key)[len(self._prefix) :].partition(b"/")
            if slash:  # a queue entry; ``<prefix>/<escaped name>`` alone is the lock's record (``…%m<key>``: a mark)
                queues.setdefault(unescape_name(escaped.decode("utf-8")), []).append(kv)
        ttl_left: dict[int, float | None] = {}
        for kvs in queues.values():
            for kv in kvs:
                lease = int(kv.lease)
                if lease and lease not in ttl_left:
                    answer, _ = self._channels.unary(
                        "read lease", "LeaseTimeToLive", etcdrpc.LeaseTimeToLiveRequest(ID=lease)
                    )
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
