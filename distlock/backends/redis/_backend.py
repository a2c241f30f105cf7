"""The Redis backend: the primitives of ``_protocol.Backend`` as Lua scripts (``_scripts``) over this package's
connection pools (``_connections``), on one Redis server or a Redis Cluster.

A lock is a sorted set of queue entries scored by token, under one ``{hash tag}`` per lock; a lease is one key per
client and TTL (``SET NX PX``, refreshed with ``PEXPIRE``, which extends the expiry of the locks queued on it too); a
waiter blocks on its own wake-up list (``BLPOP``), pushed by whoever removes the entry ahead of it. The backend
keeps no copy of the core's state: a hand-over is ``wait()``'s answer, and a refresh and a revoke are given the
client's tickets. A lock's record and its marks are written by one script that checks the holder's entry (a mark
with ``PX``: Redis expires it). The keys, tokens, waiting and what a Cluster cannot do: docs/operations/redis.md,
"How it works".

What can go wrong: Redis unreachable, restarting (``LOADING``), paused or failing over (``READONLY``, ``MOVED``):
every request is idempotent and retried with backoff until the request timeout, then ``BackendUnavailable`` names
the server (a removal whose first attempt may have landed is reported as done); refused credentials raise
``AuthenticationFailed``, other error replies ``BackendError``; a join on a gone lease raises ``LeaseGone``, one of
another kind than the queue's ``LockKindMismatch``; semaphores and read/write locks are ``unsupported`` on a
Cluster. A blocked ``BLPOP`` never outlives its timeout plus the request timeout, and an
:class:`~distlock._protocol.Interrupt` ends it at once. A failover or a restart without an fsynced append-only file
can forget a grant: the lock alone is then not exclusive, the token still is unless the server clock stepped back
(docs/GUARANTEES.md).
"""

from __future__ import annotations

import contextlib
import functools
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ConfigurationError
from ..._install import docs_url
from ..._protocol import (
    KINDS,
    Head,
    Holder,
    Interrupt,
    Lease,
    LeaseGone,
    LockState,
    Position,
    Ticket,
    Waiter,
    default_owner,
    owner_id,
    owner_record,
    unreachable,
)
from ..._retry import Attempt, ErrorTable, retrying
from ..._shape import kind_of, lock_state, mismatch
from . import socket_timeout

try:
    import redis.exceptions
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError("the Redis backend needs the 'redis' extra: pip install 'distlock-fenced[redis]'") from _e

from ._connections import Pool, RedisTarget, is_refused, is_retryable, pack_command
from ._keys import Keys, lease_of, member_of, nonce_of, owner_of
from ._scripts import ENQUEUE, HEAD, KEEP_ALIVE, LAST_MEMBER, MISSING, POSITION, REMOVE, WRITE_RECORD

__all__ = ["RedisBackend"]

_LAST_BYTES = LAST_MEMBER.encode()
#: Redis expires a key at its millisecond deadline; wake a little after it so the lease check sees it gone.
_EXPIRY_SLACK = 0.002
#: Held entries checked by one script call at most: a client holding thousands of locks does not block Redis for
#: one long script.
_CHECK_BATCH = 500
#: A lock's keys live this many lease TTLs (of the longest-lived caller) past the last script run for one of its
#: entries: a join, a read of its place, a refresh of an entry's lease (every TTL/3; at least two TTLs are then left,
#: see helpers.lua ``extend``). So they outlive every lease queued in them, and a lock nobody touches again after its
#: holder died is gone two to three TTLs after that holder's lease expired.
QUEUE_LIVES = 3
#: Dead entries of an earlier key layout at a queue's tail that a join removes at most (one by one) before it refuses.
_OLD_DEAD_EVICTED = 16


class RedisBackend:
    """Lock primitives on one Redis (server or cluster). Thread-safe; reconnects lazily after ``fork()``.

    The connections come from this package's own pools (``_connections.Pool``, one per server), which notice a new
    pid and open new connections in the child, leaving the parent's sockets alone; a Cluster's slot map is redis-py's
    ``RedisCluster``, whose own pools do the same.
    """

    def __init__(
        self, target: RedisTarget, *, prefix: str, connect_timeout: float = 5.0, request_timeout: float = 5.0
    ) -> None:
        self._target = target
        self._keys = Keys(prefix)
        self.description = target.description
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._socket_timeout = socket_timeout(connect_timeout, request_timeout)  # what the connections are made with
        self.unsupported: Mapping[str, str] = MappingProxyType(
            {
                KINDS: "semaphores and read/write locks need one Redis server (their scripts read every holder's "
                "lease, which a Redis Cluster script may not); use a plain lock, one Redis server, or etcd"
            }
            if target.one_slot_per_script
            else {}
        )
        self._errors = ErrorTable(
            description=self.description,
            retryable=is_retryable,
            translate=self._translate,
            recover=self._refresh_after,
        )

    # -- request plumbing -------------------------------------------------------------------------------------

    def _once(self, key: str | Pool, args: tuple[Any, ...], attempt: Attempt, fast: bool) -> Any:
        pool = self._target.pool_for(key) if isinstance(key, str) else key
        connection = pool.get()
        failed = False
        try:
            connection.send_packed_command([pack_command(args)], check_health=False)
            # The socket timeout bounds a first attempt whose budget is at least that long; anything else is
            # bounded by what is left of its deadline (a poll with that timeout first: a little slower).
            if not fast:
                remaining = attempt.timeout
                if remaining <= 0 or not connection.can_read(timeout=remaining):
                    raise redis.exceptions.TimeoutError(f"no answer within {max(remaining, 0):.3g} s")
            return connection.read_response()
        except redis.exceptions.ResponseError:
            raise  # an error reply: the connection itself is fine
        except BaseException:
            failed = True
            connection.disconnect()
            raise
        finally:
            pool.put(connection, failed=failed)

    def _request(
        self,
        what: str,
        key: str | Pool,
        *args: Any,
        budget: float | None = None,
        again: tuple[Any, ...] | None = None,
    ) -> tuple[Any, int]:
        """Send one command for ``key`` (or to one server's pool), retrying what may be retried; return the answer
        and the attempts made. ``again``, when given, is the command sent on attempts after the first."""
        budget = self.request_timeout if budget is None else budget
        fast = budget >= self._socket_timeout
        return retrying(
            what,
            lambda attempt: self._once(
                key, args if again is None or attempt.number == 1 else again, attempt, fast and attempt.number == 1
            ),
            _clock.now() + budget,
            self._errors,
        )

    def _refresh_after(self, error: Exception, deadline: float) -> bool:
        """After a redirection or a lost connection the Cluster layout may have changed: re-learn it, retry as usual."""
        if isinstance(error, redis.exceptions.AskError | redis.exceptions.ConnectionError) and not is_refused(error):
            with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                self._target.refresh()
        return False

    def _translate(self, error: Exception, what: str) -> BackendError | None:
        if is_refused(error):
            return AuthenticationFailed(f"{what}: {self.description} refused the credentials: {error}")
        if isinstance(error, redis.exceptions.NoScriptError):
            return None  # Script.run answers it with EVAL
        if is_retryable(error):
            return BackendUnavailable(f"{what}: {self.description} is unavailable ({error})")
        if isinstance(error, redis.exceptions.RedisError):
            return BackendError(f"{what} failed on {self.description}: {type(error).__name__}: {error}")
        return None

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        try:
            answer, _ = self._request("connect", self._keys.lease(0), "PING", budget=self.connect_timeout)
        except BackendUnavailable as e:
            hint = f"is Redis running there? ({e.__cause__})"
            raise BackendUnavailable(unreachable(self.description, self.connect_timeout, hint)) from e.__cause__
        if answer not in (b"PONG", "PONG", True):
            raise BackendError(f"{self.description} answered PING with {answer!r}: is it a Redis server?")

    def grant_lease(self, ttl: float) -> Lease:
        ttl_ms = max(math.ceil(ttl * 1000), 1)
        for _ in range(3):
            lease_id = secrets.randbits(63) or 1
            answer, attempts = self._request(
                "grant lease",
                self._keys.lease(lease_id),
                "SET",
                self._keys.lease(lease_id),
                owner_record(f"{lease_id:x}"),
                "NX",
                "PX",
                ttl_ms,
            )
            # A retried SET NX finds the key its first attempt made: ours too.
            if answer is not None or attempts > 1:
                return Lease(id=lease_id, ttl=ttl_ms / 1000)
        raise BackendError(f"grant lease: {self.description} already had three random lease ids (are they random?)")

    def keep_alive(self, lease: Lease, tickets: Sequence[Ticket], timeout: float) -> float:
        # The refresh also extends the keys of the locks the lease is queued in (the keys expire by themselves,
        # docs/operations/redis.md "What Redis keeps"): on one server in the same script, so a lock's keys are
        # extended exactly when its holder's lease is refreshed; more than _CHECK_BATCH locks cost a script per batch.
        # A Cluster script may touch one slot only: the lease key first, then one script per lock. Any failure raises,
        # and the keeper counts the whole refresh as failed: a lock whose keys were not extended is not renewed.
        deadline = _clock.now() + min(timeout, self.request_timeout)
        key = self._keys.lease(lease.id)
        ttl_ms = round(lease.ttl * 1000)  # renewed as granted, in whole milliseconds
        lives = (ttl_ms, _keys_life_ms(lease.ttl))
        cluster = self._target.one_slot_per_script
        if cluster:
            answer, _ = self._request("lease keep-alive", key, "PEXPIRE", key, ttl_ms, budget=deadline - _clock.now())
            if answer != 1:
                return 0.0
        batch = 1 if cluster else _CHECK_BATCH
        for start in range(0, max(len(tickets), 1), batch):
            chunk = tickets[start : start + batch]
            queues = tuple(self._keys.lock(ticket.name) + "q" for ticket in chunk)
            refresh = "" if cluster or start else "1"
            if not (queues or refresh):
                break
            answer, _ = KEEP_ALIVE.run(
                functools.partial(self._request, budget=deadline - _clock.now()),
                "lease keep-alive",
                (key, *queues) if refresh else queues,
                refresh,
                *lives,
                *(value for ticket in chunk for value in (ticket.key, ticket.token)),
            )
            if answer != 1:
                return 0.0
        return ttl_ms / 1000

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        key = self._keys.lease(lease.id)
        self._request("revoke lease", key, "DEL", key)
        # The entries are dead now; removing them wakes their successors at once instead of after the TTL. (The core
        # names every ticket joined on the lease and not known removed; a join answered after this removes its own.)
        for ticket in tickets:
            self._remove(ticket, check_token=True)

    def _own_lease(self, keys: tuple[str, ...], lease_id: int) -> tuple[str, ...]:
        """``keys`` plus our lease key, for scripts that check it themselves (one server: any keys go)."""
        return keys if self._target.one_slot_per_script else (*keys, self._keys.lease(lease_id))

    @property
    def _lease_prefix(self) -> str:
        """What the scripts put before a member's lease hex to read its lease key; '' on a Cluster, where they may
        not (another slot)."""
        return "" if self._target.one_slot_per_script else self._keys.lease_prefix

    def _lease_lost_behind_our_back(self, ticket: Ticket, position: Position) -> bool:
        """On a Cluster the scripts cannot see our lease: check it before we call ourselves the holder.

        A lease key can vanish while the keeper's deadline is still ahead (deleted by hand, a server clock
        jump); the entry must then not hold the lock (as etcd deletes a revoked lease's keys).
        """
        if not position.held or not self._target.one_slot_per_script:
            return False
        key = self._keys.lease(ticket.lease_id)
        alive, _ = self._request(f"check our lease on lock {ticket.name!r}", key, "EXISTS", key)
        if alive:
            return False
        self._remove(ticket, check_token=True)
        return True

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        queue = self._keys.lock(name) + "q"
        member = member_of(lease_id, nonce)
        # A waiter's id is its lease and seat (``owner_of`` reads it from the member) unless it was given an owner, and
        # the host and pid are in its lease key's value: only a given owner needs a record of its own.
        record = b"" if owner == owner_record(default_owner(lease_id, nonce)) else owner
        prefix = self._lease_prefix
        want = _keys_life_ms(lease.ttl)
        for _ in range(_OLD_DEAD_EVICTED):
            answer, attempts = ENQUEUE.run(
                self._request,
                f"enqueue for lock {name!r}",
                self._own_lease((queue,), lease_id),
                member,
                record,
                "",
                prefix,
                want,
                again=(member, record, "1", prefix, want),
            )
            if int(answer[1]) != 5:
                break
            self._evict_earlier_layout(name, bytes(answer[2]))
        else:
            raise self._earlier_layout(name, bytes(answer[2]))
        gone = LeaseGone(f"enqueue for lock {name!r}: the lease is gone on {self.description}")
        if int(answer[1]) == 3:
            raise gone
        if int(answer[1]) == 4:
            raise mismatch(name, kind_of(nonce), kind_of(nonce_of(bytes(answer[2]))))
        position = _position(answer)
        ticket = _Entry(
            name=name,
            key=member,
            token=int(answer[0]),
            lease_id=lease_id,
            resent=attempts > 1,
            owner_stored=bool(record),
            # Nobody is ahead of an entry that joined at the head, so nobody ever wakes it.
            woken=attempts > 1 or not position.held,
            lease_ttl=lease.ttl,
        )
        if self._lease_lost_behind_our_back(ticket, position):
            raise gone
        return ticket, position

    def _evict_earlier_layout(self, name: str, member: bytes) -> None:
        """The last entry of ``name``'s queue is an earlier client's (no layout mark): remove it if its lease is
        gone (the join is then tried again), else refuse: both layouts in one queue are not safe (an earlier
        client does not keep the lock's keys alive, which now expire)."""
        key = self._keys.lease(lease_of(member))
        pttl, _ = self._request(f"check an earlier client's entry on lock {name!r}", key, "PTTL", key)
        if pttl != -2:
            raise self._earlier_layout(name, member)
        self._evict(name, member)

    def _earlier_layout(self, name: str, member: bytes) -> ConfigurationError:
        return ConfigurationError(
            f"lock {name!r} is held or awaited by a distlock client of an earlier Redis key layout (queue member "
            f"{member.decode('ascii', 'replace')!r} has no layout mark) on {self.description}: upgrade every client "
            "that uses this Redis and key prefix before the new ones take its locks (stop the old ones, or let their "
            f"locks go): see 'Upgrading' at {docs_url('operations/redis.md#upgrading')}"
        )

    def position(self, ticket: Ticket) -> Position:
        keys = self._keys.lock(ticket.name)
        answer, _ = POSITION.run(
            self._request,
            f"read queue of lock {ticket.name!r}",
            self._own_lease((keys + "q",), ticket.lease_id),
            ticket.key,
            ticket.token,
            self._lease_prefix,
            _keys_life_ms(_lease_ttl(ticket)),
        )
        return self._checked(ticket, _position(answer))

    def _checked(self, ticket: Ticket, position: Position) -> Position:
        if self._lease_lost_behind_our_back(ticket, position):
            return Position(held=False, gone=True)
        return position

    def wait(self, ticket: Ticket, position: Position, timeout: float | None, interrupt: Interrupt) -> Position | None:
        if interrupt.fired:
            return None
        # Every wait ends within our own TTL at the latest: an entry ahead removed by hand (no wake-up) costs
        # one TTL, not a hang.
        own_ttl = _lease_ttl(ticket)
        limit = min(math.inf if timeout is None else timeout, own_ttl)
        # On one server the script that placed us read the lease of the waiter ahead; on a Cluster it could not.
        pttl = position.ahead_ttl_ms if isinstance(position, _WaitingPosition) else _NOT_READ
        if pttl == _NOT_READ and lease_of(position.ahead) != ticket.lease_id:
            # Our own lease is the keeper's business; another client's may have expired with nobody to say so.
            key = self._keys.lease(lease_of(position.ahead))
            pttl, _ = self._request(f"check the waiter ahead on lock {ticket.name!r}", key, "PTTL", key)
        if pttl == -2:
            self._evict(ticket.name, position.ahead)
            return None
        if pttl >= 0:
            limit = min(limit, pttl / 1000 + _EXPIRY_SLACK)
        wake_list = self._keys.lock(ticket.name) + "wake:" + ticket.key.decode("ascii")
        news = self._target.pop_wake_up(wake_list, limit, interrupt, patience=self.request_timeout)
        if news != b"h":
            return None
        # The waiter ahead released and its script made us the head (after checking our lease on one server):
        # nothing to read. The hand-over's list dies with our entry, so a popped "h" was true when popped.
        return self._checked(ticket, _HELD)

    def dequeue(self, ticket: Ticket) -> bool:
        return self._remove(ticket, check_token=True)

    def _remove(self, ticket: Ticket, *, check_token: bool) -> bool:
        keys = self._keys.lock(ticket.name)
        # A ticket of unknown origin (the head, a late join found by ``discard``) may have both an owner record and a
        # wake-up list.
        entry = ticket if isinstance(ticket, _Entry) else None
        answer, attempts = REMOVE.run(
            self._request,
            f"release lock {ticket.name!r}",
            (keys + "q",),
            ticket.key,
            ticket.token if check_token else "",
            "" if entry is not None and not entry.owner_stored else "1",
            "" if entry is not None and not entry.woken else "1",
            self._lease_prefix,
        )
        return answer == 1 or attempts > 1

    def _evict(self, name: str, member: bytes) -> None:
        """Remove ``member`` from ``name``'s queue: only ever called after seeing its lease gone (for good)."""
        keys = self._keys.lock(name)
        REMOVE.run(
            self._request,
            f"remove a dead waiter of lock {name!r}",
            (keys + "q",),
            member,
            "",
            "1",
            "1",
            self._lease_prefix,
        )

    def head(self, name: str) -> Head | None:
        keys = self._keys.lock(name)
        while True:
            answer, _ = HEAD.run(self._request, f"read holder of lock {name!r}", (keys + "q", keys + "owners"))
            if not answer:
                return None
            member, token, waiters, owner, holders = answer
            lease_id = lease_of(member)
            lease_key = self._keys.lease(lease_id)
            alive, _ = self._request(f"read holder of lock {name!r}", lease_key, "EXISTS", lease_key)
            if alive:
                holder = Holder(
                    name=name,
                    token=int(token),
                    lease_id=lease_id,
                    owner=owner_id(owner) if owner else owner_of(member),
                    waiters=waiters,
                    holders=holders,
                )
                return Head(Ticket(name=name, key=bytes(member), token=int(token), lease_id=lease_id), holder)
            self._evict(name, member)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        queue = self._keys.lock(name) + "q"
        member = member_of(lease.id, nonce)
        score, _ = self._request(f"look for a late join of lock {name!r}", queue, "ZSCORE", queue, member)
        if score is None:
            return None
        token = int(float(score))
        self._remove(Ticket(name=name, key=member, token=token, lease_id=lease.id), check_token=True)
        return token

    def write_record(self, ticket: Ticket, value: bytes) -> bool:
        # Redis cannot delete an entry when its lease key expires, so on one server the script also checks the
        # lease key. Without that check (a Cluster: the lease key has another slot) a holder past its lease may
        # still write until a waiter removes its dead entry, which is before that waiter holds: no write of the old
        # holder can come after the new holder's read.
        return self._write_held(ticket, self._keys.lock(ticket.name) + "record", value, "the record")

    def write_mark(self, ticket: Ticket, key: str, value: bytes, ttl: float) -> bool:
        # The record's script and checks, with an expiry (PX): Redis deletes the mark by itself.
        ttl_ms = max(1, math.ceil(ttl * 1000))
        return self._write_held(ticket, self._keys.mark(ticket.name, key), value, f"mark {key!r}", ttl_ms)

    def _write_held(self, ticket: Ticket, key: str, value: bytes, what: str, *ttl_ms: int) -> bool:
        queue = self._keys.lock(ticket.name) + "q"
        script_keys = self._own_lease((queue, key), ticket.lease_id)
        what = f"write {what} of lock {ticket.name!r}"
        answer, _ = WRITE_RECORD.run(self._request, what, script_keys, ticket.key, ticket.token, value, *ttl_ms)
        return bool(answer == 1)

    def read_mark(self, name: str, key: str) -> bytes | None:
        return self._get(f"read mark {key!r} of lock {name!r}", self._keys.mark(name, key))

    def _get(self, what: str, key: str) -> bytes | None:
        value, _ = self._request(what, key, "GET", key)
        return None if value is None else bytes(value)

    def read_record(self, name: str) -> bytes | None:
        return self._get(f"read the record of lock {name!r}", self._keys.lock(name) + "record")

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One script over many queues on one server; a Cluster script may only touch one slot, and each lock's
        # keys have a slot of their own: there, one script per lock. It keeps nothing alive: keep_alive does.
        batch = 1 if self._target.one_slot_per_script else _CHECK_BATCH
        gone: list[Ticket] = []
        for start in range(0, len(tickets), batch):
            chunk = tickets[start : start + batch]
            keys = tuple(self._keys.lock(ticket.name) + "q" for ticket in chunk)
            args = [value for ticket in chunk for value in (ticket.key, ticket.token)]
            answer, _ = MISSING.run(self._request, "check held locks", keys, *args)
            gone.extend(chunk[int(index) - 1] for index in answer)
        return gone

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order, and their leases' time left.

        Entries whose lease is gone are left out: they hold nothing, and the next waiter removes them.
        """
        queues: dict[str, list[tuple[bytes, int, str]]] = {}
        for pool in self._target.pools():
            cursor: Any = 0
            while True:
                (cursor, keys), _ = self._request(
                    "inspect locks", pool, "SCAN", cursor, "MATCH", self._keys.queues, "COUNT", 500
                )
                for key in keys:
                    name = self._keys.name_of(bytes(key).decode("utf-8"))
                    entries, _ = self._request("inspect locks", pool, "ZRANGE", key, 0, -1, "WITHSCORES")
                    owners, _ = self._request("inspect locks", pool, "HGETALL", bytes(key)[:-1] + b"owners")
                    records = {bytes(owners[i]): bytes(owners[i + 1]) for i in range(0, len(owners), 2)}
                    queue = []
                    for i in range(0, len(entries), 2):
                        member = bytes(entries[i])
                        if member == _LAST_BYTES:
                            continue
                        owner = owner_id(records[member]) if member in records else owner_of(member)
                        queue.append((member, int(float(entries[i + 1])), owner))
                    if name is not None and queue:
                        queues[name] = queue
                if int(cursor) == 0:
                    break
        ttl_left: dict[int, float | None] = {}
        states = []
        for name in sorted(queues):
            entries, kinds = [], []
            for member, token, owner in queues[name]:
                lease_id = lease_of(member)
                if lease_id not in ttl_left:
                    key = self._keys.lease(lease_id)
                    pttl, _ = self._request("read lease", key, "PTTL", key)
                    ttl_left[lease_id] = -2.0 if pttl == -2 else None if pttl < 0 else pttl / 1000
                if ttl_left[lease_id] != -2.0:
                    entries.append(Waiter(owner, token, lease_id, ttl_left[lease_id]))
                    kinds.append(kind_of(nonce_of(member)))
            if entries:
                states.append(lock_state(name, entries, kinds))
        return states

    def close(self) -> None:
        self._target.close()

    def after_fork(self) -> None:
        # Nothing to do: the pools notice the new pid (see the class docstring), and the backend keeps no state of
        # its own; the parent's leases and queue entries are the parent's.
        return


#: A script's answer for the PTTL of the lease ahead when it could not read it (a Cluster).
_NOT_READ = -3
_HELD = Position(held=True, waiters_ahead=0)


@dataclass(frozen=True)
class _Entry(Ticket):
    """A ticket with what removing its entry must clean up besides the entry itself."""

    #: An owner record was stored for it (only for a waiter given an owner).
    owner_stored: bool = True
    #: A wake-up may wait in its list (not for one that joined at the head: nobody is ever ahead of it).
    woken: bool = True
    #: The TTL of its lease: no wait of this entry lasts longer.
    lease_ttl: float = 1.0


@dataclass(frozen=True)
class _WaitingPosition(Position):
    """A waiting position, with the PTTL of the lease of the waiter ahead as the script read it (ms; -1: no
    expiry; ``_NOT_READ`` on a Cluster)."""

    ahead_ttl_ms: int = _NOT_READ


def _lease_ttl(ticket: Ticket) -> float:
    """The TTL of the lease ``ticket`` joined on (1 s for a ticket this backend did not make: a head read)."""
    return ticket.lease_ttl if isinstance(ticket, _Entry) else 1.0


def _keys_life_ms(ttl: float) -> int:
    """How long a lock's keys must live at least past a script run for an entry whose lease has ``ttl`` seconds."""
    return QUEUE_LIVES * max(math.ceil(ttl * 1000), 1)


def _position(answer: list[Any]) -> Position:
    state = int(answer[1])
    if state == 2:
        return Position(held=False, gone=True)
    if state == 1:
        return _HELD
    return _WaitingPosition(held=False, ahead=bytes(answer[2]), ahead_ttl_ms=int(answer[3]))
