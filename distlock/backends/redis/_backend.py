"""The Redis backend: the primitives of ``_protocol.Backend`` as Lua scripts over redis-py connections.

Keys of lock ``N`` (``E`` is the name escaped by ``_names.escape_name``, braces included), all with the hash tag
``{E}`` so that every script touches one Redis Cluster slot::

    <prefix>:{E}:q          sorted set: the FIFO queue, member "<lease hex>-<nonce>", score = its fencing token,
                            and the member "~token" whose score is the last token handed out: never expires
    <prefix>:{E}:owners     hash member -> owner record, for waiters given an owner (the id ``holder()`` reports)
    <prefix>:{E}:wake:<m>   list: the wake-up calls of waiter <m>, pushed when the waiter just ahead leaves
    <prefix>:lease:<hex>    a client's session lease: a plain key with a PX expiry, refreshed by the keeper; its
                            value names the host and pid of the process that holds it
    <prefix>:{E}:record     string: the lock's record (``write_record``), set by a script only while the writer's
                            entry is in the queue with its token (and, on one server, its lease key exists)
    <prefix>:{E}:token      the token counter of earlier versions: read once, when a queue has no "~token" yet

A waiter without an owner has its nonce as its id, and its host and pid are its lease key's: it stores no record.

Joining the queue is one script: it takes a token ``max(last token + 1, server time in µs)``, adds the waiter with
the token as its score and moves ``~token`` to the same score in one ``ZADD`` (``~`` sorts after the hex digits of
a member: ``~token`` is always last), and answers where the waiter stands, reading the last two members to learn
both the last token and the waiter it joins behind. The member with the smallest score holds the lock. New tokens
are larger than every earlier one, so the queue is in arrival order and a holder's token is larger than every
earlier holder's. The clock floor is why tokens keep increasing when the last token itself goes back: a Redis
restarted without its append-only file, or a replica promoted before it had the last join, still hands out the
current time (see docs/GUARANTEES.md for what remains: a server clock that steps back). A first attempt joins
without looking for its member (a fresh nonce cannot be there); a retried one looks first, so joining is
idempotent.

Liveness is the lease key, one per client and TTL: a queue entry whose lease key is gone is dead, and a dead
lease never comes back (keys are made with ``SET NX`` from 63 random bits, and refreshed with ``PEXPIRE``, which
does not create). A lease is granted in whole milliseconds, the TTL asked rounded up, and each refresh renews what
was granted; the session keeper never asks for less than a second (below that a refresh has no time to be late).

Redis cannot delete the entries of an expired key itself, so

- a waiter waits for the one just ahead with ``BLPOP`` on its own wake list, for at most the ahead's lease's
  ``PTTL``; when that runs out it finds the lease gone and removes the dead entry (without a token check: a dead
  lease never comes back), so a crashed holder frees the lock within its TTL and a dead waiter cannot block the
  queue;
- every removal (release, give-up, eviction, an operator's force release) pushes one wake-up to the waiter just
  behind: a release wakes one waiter, never a herd, and the wake-up waits in its list if that waiter is not blocked
  yet (no lost wake-up). When the head leaves, the wake-up says "you hold the lock" (``h``, pushed to the front),
  and the waiter holds it when it pops that, without reading the queue again: the list is deleted with its entry,
  and nobody gets ahead of a head, so a popped ``h`` was true when popped. Any other removal says "look again";
- revoking a lease (closing the client, losing a session) deletes the lease key and then the entries this
  process still has on it, so their successors do not wait out the TTL.

On one server the scripts also read lease keys (Redis lets a script outside a Cluster read keys it was not given;
the lease keys are named from the members): joining and reading the queue check the caller's own lease (passed as
a key), so an entry whose lease vanished behind its client's back (deleted by hand, a server clock jump) never
holds the lock; they answer the ``PTTL`` of the lease of the waiter ahead, and remove that waiter at once if its
lease is gone; and a release hands the lock only to a waiter whose lease exists, removing dead ones on the way
(each told to look again, in case its client lives on). A Cluster script may only touch its lock's slot: there
the client checks its own lease with ``EXISTS`` before it calls itself the holder and the lease ahead with
``PTTL`` before it waits, a request each.

Semaphores and read/write locks (``_shape``) share the queue: the member's nonce starts with its kind
(``<lease hex>-<kind>.<nonce>``), and the scripts carry the grant rule in Lua. Their place is read by walking the
entries ahead (removing those whose lease is gone) and a waiter waits at most until the first lease among the
conflicting entries ahead ends; a removal wakes exactly the entries it let in. A join of another kind than the
queue's is refused in the script (``LockKindMismatch``); on a Cluster they are refused (the walk reads leases).

An uncontended acquire + release is two scripts and eight commands on one server (the join: ``EXISTS``, ``TIME``,
``ZRANGE``, ``ZADD``; the release: ``ZRANGE``, ``ZREM``); a removal skips the owner record and the wake list
when the client knows there is none.

What can go wrong: Redis can be unreachable, restarting (``LOADING``), paused, or failing over (``READONLY``,
``MOVED``). Every request is idempotent (a join sent again looks for its member first; removals check the member,
and its token when they know it), so these are retried with backoff until the request timeout, then
``BackendUnavailable`` names the server. A removal whose first attempt may have landed is reported as done. A
blocked ``BLPOP`` never outlives its timeout plus the request timeout, and an
:class:`~distlock._protocol.Interrupt` shuts its socket down at once. Lease expiry follows the Redis server's
clock, and failover or a restart without an fsynced append-only file can lose recent writes: the lock alone is
then not exclusive; the fencing token still is, unless the server
clock stepped back (docs/GUARANTEES.md).
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ... import _clock
from ..._errors import AuthenticationFailed, BackendError, BackendUnavailable, ClientClosed, ConfigurationError
from ..._names import escape_name, unescape_name
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
    owner_id,
    owner_record,
    unreachable,
)
from ..._retry import Attempt, ErrorTable, retrying
from ..._shape import kind_of, lock_state, mismatch
from . import socket_timeout

try:
    import redis
    import redis.cluster
    import redis.exceptions
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError("the Redis backend needs the 'redis' extra: pip install 'distlock-fenced[redis]'") from _e

__all__ = ["RedisBackend", "RedisCluster", "RedisServer", "RedisTarget"]

#: The queue's last member, never a waiter (members are ``<lease hex>-<nonce>``): its score is the last token
#: handed out, so the queue is the token counter too. It sorts after a waiter of equal score (``~`` after hex digits).
_LAST = "~token"
_LAST_BYTES = _LAST.encode()
#: How long a wake-up waits in its list for a waiter that is not blocked yet (one that is later re-reads anyway).
_WAKE_TTL_MS = 600_000
#: Redis expires a key at its millisecond deadline; wake a little after it so the lease check sees it gone.
_EXPIRY_SLACK = 0.002
#: Errors that mean "not now": a restart, a replay, a failover in progress, a slot moving.
_RETRYABLE = (
    redis.exceptions.RedisClusterException,  # no node of a cluster reachable, a slot not served
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.AskError,  # MovedError too
)
_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
    redis.exceptions.NoPermissionError,
)


def _refused(error: Exception) -> bool:
    return isinstance(error, _REFUSED)


def _retryable(error: Exception) -> bool:
    # Checked after _refused: redis-py's AuthenticationError is a ConnectionError too.
    return isinstance(error, _RETRYABLE) and not _refused(error)


# -- the scripts ----------------------------------------------------------------------------------------------
#
# Tokens are integers below 2^53 (microseconds since 1970 stay below it until the year 2255), so Lua's doubles
# hold them exactly; they are formatted with %.0f wherever they become a string, and returned as numbers.

_LUA_HELPERS = """
local LAST = 'LAST_MEMBER'
local function fmt(n) return string.format('%.0f', n) end
local function base_of(q) return string.sub(q, 1, -2) end
local function lease_key(prefix, member) return prefix .. string.match(member, '^[^-]*') end
-- Take an entry out with, when asked, its owner record and its wake-up list: nobody is woken.
local function drop(q, member, owner, wake)
  redis.call('ZREM', q, member)
  if owner then redis.call('HDEL', base_of(q) .. 'owners', member) end
  if wake then redis.call('DEL', base_of(q) .. 'wake:' .. member) end
end
-- Wake a waiter: 'h' (you hold the lock) goes first, '1' (look again) last; the list dies with its entry.
local function notify(q, member, news)
  local key = base_of(q) .. 'wake:' .. member
  if news == 'h' then redis.call('LPUSH', key, news) else redis.call('RPUSH', key, news) end
  redis.call('PEXPIRE', key, WAKE_TTL_MS)
end
-- The head left: tell the next waiter it holds the lock, after checking its lease where the script may read it
-- (prefix '' on a Cluster). A waiter whose lease is gone is taken out on the way and told to look again: if its
-- client lives on (its lease deleted behind its back), it learns at once that it must queue again.
local function hand_over(q, nxt, prefix)
  for i = 1, 16 do
    if not nxt or nxt == LAST then return end
    if prefix == '' or redis.call('EXISTS', lease_key(prefix, nxt)) == 1 then
      notify(q, nxt, 'h')
      return
    end
    drop(q, nxt, true, false)
    notify(q, nxt, '1')
    nxt = redis.call('ZRANGE', q, 0, 0)[1]
  end
  if nxt and nxt ~= LAST then notify(q, nxt, '1') end
end
-- The kind of an entry (see distlock/_shape.py): nil for a lock's, 'sN' a semaphore slot of limit N, 'r'/'w' a
-- reader/writer. An entry holds when fewer than its limit of the entries ahead conflict with it.
local function kind(member) return string.match(member, '^[^-]*%-(%w+)%.') end
local function family(k)
  if k == 'r' or k == 'w' then return 'rw' end
  return k or ''
end
local function limit(k)
  if k and string.sub(k, 1, 1) == 's' then return tonumber(string.sub(k, 2)) end
  return 1
end
local function conflicts(behind, ahead) return not (behind == 'r' and ahead == 'r') end
-- A semaphore's or read/write lock's entry left at score s: wake every entry it kept from holding, now holding (the
-- walk from the head stops at the first entry that waits: everything behind it waits too). A wake-up goes only
-- to an entry whose lease lives; a dead one is removed by the next waiter that reads its place.
local function wake_kinds(q, gone, s, prefix)
  local entries, writers, start = 0, 0, 0
  while true do
    local chunk = redis.call('ZRANGE', q, start, start + 63, 'WITHSCORES')
    if #chunk == 0 then return end
    for i = 1, #chunk, 2 do
      local m = chunk[i]
      if m == LAST then return end
      local k = kind(m)
      local ahead = entries
      if k == 'r' then ahead = writers end
      if ahead >= limit(k) then return end
      if tonumber(chunk[i + 1]) > s and ahead + 1 >= limit(k) and conflicts(k, gone)
        and (prefix == '' or redis.call('EXISTS', lease_key(prefix, m)) == 1) then
        notify(q, m, 'h')
      end
      entries = entries + 1
      if k ~= 'r' then writers = writers + 1 end
    end
    start = start + 64
  end
end
-- Where entry member (at token t) of a semaphore or read/write lock stands: {t, 1} when it holds, else {t, 0, the
-- conflicting entry ahead whose lease ends first, PTTL of that lease}. Entries ahead whose lease is gone are taken
-- out (a waiter they kept waiting wakes by its own PTTL, which was theirs at most).
local function place_kind(q, t, member, prefix)
  local k = kind(member)
  local n, on, pttl = 0, nil, nil
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', q, '-inf', '(' .. fmt(t))) do
    if m ~= LAST then
      local left = redis.call('PTTL', lease_key(prefix, m))
      if left == -2 then
        drop(q, m, true, true)
      elseif conflicts(k, kind(m)) then
        n = n + 1
        if not pttl or (left >= 0 and (pttl < 0 or left < pttl)) then on, pttl = m, left end
      end
    end
  end
  if n < limit(k) then return {t, 1} end
  return {t, 0, on, pttl}
end
-- Remove member (only at token t, when t is given) and wake the waiter behind it. 1 if removed.
local function remove(q, member, t, owner, wake, prefix)
  local k = kind(member)
  if k then
    local score = redis.call('ZSCORE', q, member)
    if not score or (t and tonumber(score) ~= t) then return 0 end
    drop(q, member, owner, wake)
    wake_kinds(q, k, tonumber(score), prefix)
    return 1
  end
  local first = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
  if first[1] == member then
    if t and tonumber(first[2]) ~= t then return 0 end
    drop(q, member, owner, wake)
    hand_over(q, first[3], prefix)
    return 1
  end
  local score = redis.call('ZSCORE', q, member)
  if not score or (t and tonumber(score) ~= t) then return 0 end
  local behind = redis.call('ZRANGEBYSCORE', q, '(' .. fmt(tonumber(score)), '+inf', 'LIMIT', 0, 1)
  drop(q, member, owner, wake)
  if behind[1] and behind[1] ~= LAST then notify(q, behind[1], '1') end
  return 1
end
-- Where the entry at token t stands: {t, 1} at the head, else {t, 0, member ahead, PTTL of its lease} (-3: not
-- read, on a Cluster). A waiter ahead whose lease is gone is taken out first (nobody to wake: we are behind it).
local function place(q, t, prefix, ahead)
  for i = 1, 16 do
    if not ahead then
      ahead = redis.call('ZREVRANGEBYSCORE', q, '(' .. fmt(t), '-inf', 'LIMIT', 0, 1)[1]
      if not ahead then return {t, 1} end
    end
    if prefix == '' then return {t, 0, ahead, -3} end
    local pttl = redis.call('PTTL', lease_key(prefix, ahead))
    if pttl ~= -2 or i == 16 then return {t, 0, ahead, pttl} end
    drop(q, ahead, true, true)
    ahead = nil
  end
end
""".replace("WAKE_TTL_MS", str(_WAKE_TTL_MS)).replace("LAST_MEMBER", _LAST)

# KEYS: queue, legacy counter, owners[, lease]. ARGV: member, owner record ('' to store none), '1' when this join
# may have been sent before ('' on a first attempt: the member cannot exist yet), lease key prefix ('' on a
# Cluster). Answers {token, 1} (head), {token, 0, member ahead, PTTL of its lease}, {0, 3} when our lease key is
# gone, or {0, 4, the last member} when that member is of another kind's family (a lock joined as a semaphore...).
# Joining twice with one member answers the first place.
_ENQUEUE = (
    _LUA_HELPERS
    + """
local q, member, prefix = KEYS[1], ARGV[1], ARGV[4]
local again = ARGV[3] ~= ''
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 0 then
  if again then remove(q, member, nil, true, true, prefix) end
  return {0, 3}
end
if again then
  local score = redis.call('ZSCORE', q, member)
  if score and kind(member) then return place_kind(q, tonumber(score), member, prefix) end
  if score then return place(q, tonumber(score), prefix, nil) end
end
local now = redis.call('TIME')
local t = tonumber(now[1]) * 1000000 + tonumber(now[2])
local counted, ahead = false, nil
local tail = redis.call('ZRANGE', q, -2, -1, 'WITHSCORES')
for i = 1, #tail, 2 do
  if tail[i] == LAST then counted = true else ahead = tail[i] end
  local s = tonumber(tail[i + 1])
  if s >= t then t = s + 1 end
end
if ahead and family(kind(ahead)) ~= family(kind(member)) then return {0, 4, ahead} end
if not counted then
  local legacy = tonumber(redis.call('GET', KEYS[2]) or '0')
  if legacy >= t then t = legacy + 1 end
end
redis.call('ZADD', q, fmt(t), member, fmt(t), LAST)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[3], member, ARGV[2]) end
if not ahead then return {t, 1} end
if kind(member) then return place_kind(q, t, member, prefix) end
return place(q, t, prefix, ahead)
"""
)

# KEYS: queue[, lease]. ARGV: member, token, lease key prefix. Answers like _ENQUEUE, or {0, 2} when the entry is
# gone (or its lease is: then the entry is removed).
_POSITION = (
    _LUA_HELPERS
    + """
local q, member, t = KEYS[1], ARGV[1], tonumber(ARGV[2])
local score = redis.call('ZSCORE', q, member)
if not score or tonumber(score) ~= t then return {0, 2} end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then
  remove(q, member, t, true, true, ARGV[3])
  return {0, 2}
end
if kind(member) then return place_kind(q, t, member, ARGV[3]) end
return place(q, t, ARGV[3], nil)
"""
)

# KEYS: queue. ARGV: member, token (or '' for any), '1' to delete its owner record, '1' to delete its wake-up list,
# lease key prefix. 1 if removed.
_REMOVE = (
    _LUA_HELPERS
    + """
local t = nil
if ARGV[2] ~= '' then t = tonumber(ARGV[2]) end
return remove(KEYS[1], ARGV[1], t, ARGV[3] ~= '', ARGV[4] ~= '', ARGV[5])
"""
)

# KEYS: queue, owners. Answers {} or {member, token, entries that wait, owner record, entries that hold}: those that
# hold are counted by the grant rule from the head (a semaphore's slots and readers hold together; the walk stops at the
# first entry that waits, and everything behind it waits too).
_HEAD = (
    _LUA_HELPERS
    + """
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 or head[1] == LAST then return {} end
local entries = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], LAST) then entries = entries - 1 end
local holders, writers, start = 0, 0, 0
while holders == start do
  local chunk = redis.call('ZRANGE', KEYS[1], start, start + 63)
  for _, m in ipairs(chunk) do
    if m == LAST then break end
    local k = kind(m)
    local ahead = holders
    if k == 'r' then ahead = writers end
    if ahead >= limit(k) then break end
    holders = holders + 1
    if k ~= 'r' then writers = writers + 1 end
  end
  if #chunk < 64 then break end
  start = start + 64
end
return {head[1], tonumber(head[2]), entries - holders, redis.call('HGET', KEYS[2], head[1]) or '', holders}
"""
)

# KEYS: queues. ARGV: member and token of each queue's entry, in turn. Answers the (1-based) indexes of the entries
# that are gone.
_MISSING = """
local gone = {}
for i, q in ipairs(KEYS) do
  local score = redis.call('ZSCORE', q, ARGV[2 * i - 1])
  if not score or tonumber(score) ~= tonumber(ARGV[2 * i]) then gone[#gone + 1] = i end
end
return gone
"""

# KEYS: queue, record[, lease]. ARGV: member, token, value. 1 when the entry is still in the queue with that token
# (and its lease key exists, when given) and the record was set; else 0.
_WRITE_RECORD = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
return 1
"""

#: Held entries checked by one script call at most: a client holding thousands of locks does not block Redis for
#: one long script.
_CHECK_BATCH = 500


class _Script:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = _sha1(source)


def _sha1(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


ENQUEUE, POSITION, REMOVE, HEAD, MISSING, WRITE_RECORD = (
    _Script(s) for s in (_ENQUEUE, _POSITION, _REMOVE, _HEAD, _MISSING, _WRITE_RECORD)
)


#: Besides ``/``, braces are escaped in lock names: a brace would end the ``{hash tag}`` that keeps a lock's keys in
#: one Cluster slot.
_RESERVED = "/{}"


def _name_of(key: str, prefix: str) -> str | None:
    """The lock name of a queue key ``<prefix>:{<escaped>}:q`` (None for a key that is not one)."""
    start = f"{prefix}:{{"
    if not (key.startswith(start) and key.endswith("}:q")):
        return None
    return unescape_name(key[len(start) : -3])


def _lease_of(member: bytes) -> int:
    """The lease id in a queue member ``<lease hex>-<nonce>`` (0, a lease that never exists, if malformed)."""
    try:
        return int(member.split(b"-", 1)[0], 16)
    except ValueError:
        return 0


def _nonce_of(member: bytes) -> str:
    """The waiter's nonce: the opaque owner id that ``owner_record`` would have stored."""
    return member.split(b"-", 1)[-1].decode("ascii", "replace")


# -- where the keys live ------------------------------------------------------------------------------------


class _Pool:
    """Idle connections to one server, reused last in, first out; a new one is made when none is idle.

    Leaner than redis-py's ``ConnectionPool`` (no health-check read, no metrics per checkout), which is a fifth
    of an uncontended lock's cost at two requests per acquisition. A connection comes back disconnected after
    an error and reconnects on its next send; an error also drops the idle ones, likely as dead (a restart).
    After ``fork()`` the parent's connections are left alone: the child only drops its references.
    """

    def __init__(self, connection_class: Any, options: dict[str, Any]) -> None:
        self._connection_class = connection_class
        self._options = options
        self._mutex = threading.Lock()
        self._idle: list[Any] = []
        self._pid = os.getpid()
        self._closed = False

    def get(self) -> Any:
        with self._mutex:
            if self._pid != os.getpid():
                self._pid, self._idle = os.getpid(), []
            if self._closed:
                raise ClientClosed("the distlock client is closed")
            if self._idle:
                return self._idle.pop()
        # No retry=: redis-py's connections then retry nothing; RedisBackend retries within its deadline. RESP2,
        # whatever redis-py's default: the replies parsed here have one shape across redis-py versions.
        return self._connection_class(protocol=2, **self._options)

    def put(self, connection: Any, *, failed: bool = False) -> None:
        with self._mutex:
            keep = not self._closed and self._pid == os.getpid()
            stale, self._idle = (self._idle, []) if failed else ([], self._idle)
            if keep:
                self._idle.append(connection)
        for old in stale if keep else [*stale, connection]:
            old.disconnect()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()


class RedisTarget:
    """Where the commands for a key go: a pool per server. Subclassed per deployment."""

    description: str
    #: True when a script may only touch keys of one slot (Cluster): then it cannot check a lease key.
    one_slot_per_script = False

    def pool_for(self, key: str) -> _Pool:
        """The pool of the server that serves ``key``."""
        raise NotImplementedError

    def pools(self) -> list[_Pool]:
        """The pools of every server that holds keys (every master of a Cluster)."""
        raise NotImplementedError

    def refresh(self) -> None:
        """Re-learn the layout after a redirection (Cluster); nothing to do for one server."""

    def close(self) -> None:
        raise NotImplementedError


def _where(hosts: list[tuple[str, int]]) -> str:
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in hosts)


def _connection_class(tls: bool) -> Any:
    return redis.SSLConnection if tls else redis.Connection


class RedisServer(RedisTarget):
    """One Redis server (``redis://``, ``rediss://``). Connections are made on first use."""

    def __init__(self, address: tuple[str, int], db: int, tls: bool, options: dict[str, Any]) -> None:
        self._pool = _Pool(_connection_class(tls), {**options, "host": address[0], "port": address[1], "db": db})
        self.description = f"Redis at {_where([address])}" + (f" (database {db})" if db else "")

    def pool_for(self, key: str) -> _Pool:
        return self._pool

    def pools(self) -> list[_Pool]:
        return [self._pool]

    def close(self) -> None:
        self._pool.close()


class RedisCluster(RedisTarget):
    """A Redis Cluster (``redis+cluster://``): redis-py's slot map says which master serves a key's slot.

    The slot map is read on first use (not when connecting, so that ``connect()`` errors come from ``check()``)
    and again after a ``MOVED``/``ASK`` redirection or a connection error.
    """

    one_slot_per_script = True

    def __init__(self, hosts: list[tuple[str, int]], tls: bool, options: dict[str, Any]) -> None:
        self._hosts = hosts
        self._tls = tls
        self._options = options
        self._mutex = threading.Lock()
        self._cluster: Any = None
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._closed = False
        self.description = f"Redis Cluster at {_where(hosts)}"

    def _slots(self) -> Any:
        with self._mutex:
            if self._closed:
                raise ClientClosed("the distlock client is closed")
            if self._cluster is None:
                nodes = [redis.cluster.ClusterNode(host, port) for host, port in self._hosts]  # type: ignore[no-untyped-call]
                self._cluster = redis.cluster.RedisCluster(startup_nodes=nodes, ssl=self._tls, **self._options)
            return self._cluster

    def pool_for(self, key: str) -> _Pool:
        node = self._slots().get_node_from_key(key)
        return self._pool((str(node.host), int(node.port)))

    def pools(self) -> list[_Pool]:
        return [self._pool((str(node.host), int(node.port))) for node in self._slots().get_primaries()]

    def _pool(self, address: tuple[str, int]) -> _Pool:
        with self._mutex:
            pool = self._pools.get(address)
            if pool is None:
                options = {**self._options, "host": address[0], "port": address[1]}
                pool = self._pools[address] = _Pool(_connection_class(self._tls), options)
            return pool

    def refresh(self) -> None:
        self._slots().nodes_manager.initialize()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            cluster, self._cluster = self._cluster, None
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
        if cluster is not None:
            cluster.close()


# -- the backend --------------------------------------------------------------------------------------------


class RedisBackend:
    """Lock primitives on one Redis (server or cluster). Thread-safe; reconnects lazily after ``fork()``.

    The connections come from this module's own pools (``_Pool``, one per server), which notice a new pid and open
    new connections in the child, leaving the parent's sockets alone; a Cluster's slot map is redis-py's
    ``RedisCluster``, whose own pools do the same.
    """

    def __init__(
        self, target: RedisTarget, *, prefix: str, connect_timeout: float = 5.0, request_timeout: float = 5.0
    ) -> None:
        self._target = target
        self._prefix = prefix
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
            retryable=_retryable,
            translate=self._translate,
            recover=self._refresh_after,
        )

    # -- keys -------------------------------------------------------------------------------------------------

    def _lease_key(self, lease_id: int) -> str:
        return f"{self._prefix}:lease:{lease_id:x}"

    def _lock_keys(self, name: str) -> str:
        """The common start of every key of lock ``name``: ``<prefix>:{<escaped>}:``."""
        return f"{self._prefix}:{{{escape_name(name, _RESERVED)}}}:"

    # -- request plumbing -------------------------------------------------------------------------------------

    def _once(self, key: str | _Pool, args: tuple[Any, ...], attempt: Attempt, fast: bool) -> Any:
        pool = self._target.pool_for(key) if isinstance(key, str) else key
        connection = pool.get()
        failed = False
        try:
            connection.send_packed_command([_pack(args)], check_health=False)
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
        key: str | _Pool,
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
        if isinstance(error, redis.exceptions.AskError | redis.exceptions.ConnectionError) and not _refused(error):
            with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                self._target.refresh()
        return False

    def _translate(self, error: Exception, what: str) -> BackendError | None:
        if _refused(error):
            return AuthenticationFailed(f"{what}: {self.description} refused the credentials: {error}")
        if isinstance(error, redis.exceptions.NoScriptError):
            return None  # _script answers it with EVAL
        if _retryable(error):
            return BackendUnavailable(f"{what}: {self.description} is unavailable ({error})")
        if isinstance(error, redis.exceptions.RedisError):
            return BackendError(f"{what} failed on {self.description}: {type(error).__name__}: {error}")
        return None

    def _script(
        self, what: str, script: _Script, keys: tuple[str, ...], *args: Any, again: tuple[Any, ...] | None = None
    ) -> tuple[Any, int]:
        """Run ``script``; ``again``, when given, are the arguments of every call after the first."""
        head = (len(keys), *keys)
        retried = None if again is None else ("EVALSHA", script.sha, *head, *again)
        try:
            return self._request(what, keys[0], "EVALSHA", script.sha, *head, *args, again=retried)
        except redis.exceptions.NoScriptError:
            # Not cached (a new or restarted server): EVAL sends the source and caches it. An EVALSHA before it
            # may have been retried, so this is an "again" call.
            return self._request(what, keys[0], "EVAL", script.source, *head, *(args if again is None else again))

    # -- Backend protocol -------------------------------------------------------------------------------------

    def check(self) -> None:
        try:
            answer, _ = self._request("connect", self._lease_key(0), "PING", budget=self.connect_timeout)
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
                self._lease_key(lease_id),
                "SET",
                self._lease_key(lease_id),
                owner_record(f"{lease_id:x}"),
                "NX",
                "PX",
                ttl_ms,
            )
            # A retried SET NX finds the key its first attempt made: ours too.
            if answer is not None or attempts > 1:
                return Lease(id=lease_id, ttl=ttl_ms / 1000)
        raise BackendError(f"grant lease: {self.description} already had three random lease ids (are they random?)")

    def keep_alive(self, lease: Lease, timeout: float) -> float:
        key = self._lease_key(lease.id)
        ttl_ms = round(lease.ttl * 1000)  # renewed as granted, in whole milliseconds
        answer, _ = self._request(
            "lease keep-alive", key, "PEXPIRE", key, ttl_ms, budget=min(timeout, self.request_timeout)
        )
        return ttl_ms / 1000 if answer == 1 else 0.0

    def revoke_lease(self, lease: Lease, tickets: Sequence[Ticket]) -> None:
        key = self._lease_key(lease.id)
        self._request("revoke lease", key, "DEL", key)
        # The entries are dead now; removing them wakes their successors at once instead of after the TTL. (An entry
        # whose join was under way is not among ``tickets``: its successor finds its lease gone and removes it.)
        for ticket in tickets:
            self._remove(ticket, check_token=True)

    def _own_lease(self, keys: tuple[str, ...], lease_id: int) -> tuple[str, ...]:
        """``keys`` plus our lease key, for scripts that check it themselves (one server: any keys go)."""
        return keys if self._target.one_slot_per_script else (*keys, self._lease_key(lease_id))

    @property
    def _lease_prefix(self) -> str:
        """What the scripts put before a member's lease hex to read its lease key; '' on a Cluster, where they may
        not (another slot)."""
        return "" if self._target.one_slot_per_script else f"{self._prefix}:lease:"

    def _lease_lost_behind_our_back(self, ticket: Ticket, position: Position) -> bool:
        """On a Cluster the scripts cannot see our lease: check it before we call ourselves the holder.

        A lease key can vanish while the keeper's deadline is still ahead (deleted by hand, a server clock
        jump); the entry must then not hold the lock (as etcd deletes a revoked lease's keys).
        """
        if not position.held or not self._target.one_slot_per_script:
            return False
        key = self._lease_key(ticket.lease_id)
        alive, _ = self._request(f"check our lease on lock {ticket.name!r}", key, "EXISTS", key)
        if alive:
            return False
        self._remove(ticket, check_token=True)
        return True

    def enqueue(self, name: str, lease: Lease, nonce: str, owner: bytes) -> tuple[Ticket, Position]:
        lease_id = lease.id
        keys = self._lock_keys(name)
        member = f"{lease_id:x}-{nonce}".encode("ascii")
        # A waiter's id is its nonce unless it was given an owner, and the host and pid are in its lease key's
        # value: only a given owner needs a record of its own.
        record = b"" if owner == owner_record(nonce) else owner
        prefix = self._lease_prefix
        answer, attempts = self._script(
            f"enqueue for lock {name!r}",
            ENQUEUE,
            self._own_lease((keys + "q", keys + "token", keys + "owners"), lease_id),
            member,
            record,
            "",
            prefix,
            again=(member, record, "1", prefix),
        )
        gone = LeaseGone(f"enqueue for lock {name!r}: the lease is gone on {self.description}")
        if int(answer[1]) == 3:
            raise gone
        if int(answer[1]) == 4:
            raise mismatch(name, kind_of(nonce), kind_of(_nonce_of(bytes(answer[2]))))
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

    def position(self, ticket: Ticket) -> Position:
        keys = self._lock_keys(ticket.name)
        answer, _ = self._script(
            f"read queue of lock {ticket.name!r}",
            POSITION,
            self._own_lease((keys + "q",), ticket.lease_id),
            ticket.key,
            ticket.token,
            self._lease_prefix,
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
        own_ttl = ticket.lease_ttl if isinstance(ticket, _Entry) else 1.0
        limit = min(math.inf if timeout is None else timeout, own_ttl)
        # On one server the script that placed us read the lease of the waiter ahead; on a Cluster it could not.
        pttl = position.ahead_ttl_ms if isinstance(position, _Place) else _NOT_READ
        if pttl == _NOT_READ and _lease_of(position.ahead) != ticket.lease_id:
            # Our own lease is the keeper's business; another client's may have expired with nobody to say so.
            key = self._lease_key(_lease_of(position.ahead))
            pttl, _ = self._request(f"check the waiter ahead on lock {ticket.name!r}", key, "PTTL", key)
        if pttl == -2:
            self._evict(ticket.name, position.ahead)
            return None
        if pttl >= 0:
            limit = min(limit, pttl / 1000 + _EXPIRY_SLACK)
        news = self._block(self._lock_keys(ticket.name) + "wake:" + ticket.key.decode("ascii"), limit, interrupt)
        if news != b"h":
            return None
        # The waiter ahead released and its script made us the head (after checking our lease on one server):
        # nothing to read. The hand-over's list dies with our entry, so a popped "h" was true when popped.
        return self._checked(ticket, _HELD)

    def _block(self, key: str, limit: float, interrupt: Interrupt) -> bytes | None:
        """``BLPOP key`` for at most ``limit`` s; a fired ``interrupt`` shuts the socket down to end it early.
        Returns what was popped (None when nothing was)."""
        try:
            pool = self._target.pool_for(key)
            connection = pool.get()
            connection.connect()  # the socket must exist before the interrupt can reach it
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            # Unreachable: pause briefly so a dead server is not spun on; the caller's next read raises.
            time.sleep(min(0.05, max(limit, 0)))
            return None
        unregister = interrupt.on_fire(lambda: _shut_down(connection))
        failed = True
        popped = None
        try:
            connection.send_packed_command([_pack(("BLPOP", key, f"{max(limit, 0.001):.3f}"))], check_health=False)
            # A paused server cannot hold us past our limit plus one request's worth of patience.
            if connection.can_read(timeout=limit + self.request_timeout):
                answer = connection.read_response()
                popped = None if answer is None else bytes(answer[1])
                failed = False
            else:
                connection.disconnect()  # the BLPOP is still pending on it
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            connection.disconnect()
            if not interrupt.fired:
                time.sleep(min(0.05, max(limit, 0)))
        except redis.exceptions.ResponseError as e:
            failed = False
            raise BackendError(f"wait on {self.description} failed: {e}") from e
        finally:
            unregister()
            pool.put(connection, failed=failed and not interrupt.fired)
        return popped

    def dequeue(self, ticket: Ticket) -> bool:
        return self._remove(ticket, check_token=True)

    def _remove(self, ticket: Ticket, *, check_token: bool) -> bool:
        keys = self._lock_keys(ticket.name)
        # A ticket of unknown origin (the head, a late join found by ``discard``) may have both an owner record and a
        # wake-up list.
        entry = ticket if isinstance(ticket, _Entry) else None
        answer, attempts = self._script(
            f"release lock {ticket.name!r}",
            REMOVE,
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
        keys = self._lock_keys(name)
        self._script(
            f"remove a dead waiter of lock {name!r}",
            REMOVE,
            (keys + "q",),
            member,
            "",
            "1",
            "1",
            self._lease_prefix,
        )

    def head(self, name: str) -> Head | None:
        keys = self._lock_keys(name)
        while True:
            answer, _ = self._script(f"read holder of lock {name!r}", HEAD, (keys + "q", keys + "owners"))
            if not answer:
                return None
            member, token, waiters, owner, holders = answer
            lease_id = _lease_of(member)
            lease_key = self._lease_key(lease_id)
            alive, _ = self._request(f"read holder of lock {name!r}", lease_key, "EXISTS", lease_key)
            if alive:
                holder = Holder(
                    name=name,
                    token=int(token),
                    lease_id=lease_id,
                    owner=owner_id(owner) if owner else _nonce_of(member),
                    waiters=waiters,
                    holders=holders,
                )
                return Head(Ticket(name=name, key=bytes(member), token=int(token), lease_id=lease_id), holder)
            self._evict(name, member)

    def discard(self, name: str, lease: Lease, nonce: str) -> int | None:
        queue = self._lock_keys(name) + "q"
        member = f"{lease.id:x}-{nonce}".encode("ascii")
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
        keys = self._lock_keys(ticket.name)
        script_keys = self._own_lease((keys + "q", keys + "record"), ticket.lease_id)
        what = f"write the record of lock {ticket.name!r}"
        answer, _ = self._script(what, WRITE_RECORD, script_keys, ticket.key, ticket.token, value)
        return bool(answer == 1)

    def read_record(self, name: str) -> bytes | None:
        key = self._lock_keys(name) + "record"
        value, _ = self._request(f"read the record of lock {name!r}", key, "GET", key)
        return None if value is None else bytes(value)

    def missing_tickets(self, tickets: Sequence[Ticket]) -> list[Ticket]:
        # One script over many queues on one server; a Cluster script may only touch one slot, and each lock's
        # keys have a slot of their own: there, one script per lock.
        batch = 1 if self._target.one_slot_per_script else _CHECK_BATCH
        gone: list[Ticket] = []
        for start in range(0, len(tickets), batch):
            chunk = tickets[start : start + batch]
            keys = tuple(self._lock_keys(ticket.name) + "q" for ticket in chunk)
            args = [value for ticket in chunk for value in (ticket.key, ticket.token)]
            answer, _ = self._script("check held locks", MISSING, keys, *args)
            gone.extend(chunk[int(index) - 1] for index in answer)
        return gone

    def inspect(self) -> list[LockState]:
        """Every lock under this prefix with its holder and waiters in queue order, and their leases' time left.

        Entries whose lease is gone are left out: they hold nothing, and the next waiter removes them.
        """
        queues: dict[str, list[tuple[bytes, int, str]]] = {}
        pattern = f"{self._prefix}:{{*}}:q"
        for pool in self._target.pools():
            cursor: Any = 0
            while True:
                (cursor, keys), _ = self._request("inspect locks", pool, "SCAN", cursor, "MATCH", pattern, "COUNT", 500)
                for key in keys:
                    name = _name_of(bytes(key).decode("utf-8"), self._prefix)
                    entries, _ = self._request("inspect locks", pool, "ZRANGE", key, 0, -1, "WITHSCORES")
                    owners, _ = self._request("inspect locks", pool, "HGETALL", bytes(key)[:-1] + b"owners")
                    records = {bytes(owners[i]): bytes(owners[i + 1]) for i in range(0, len(owners), 2)}
                    queue = []
                    for i in range(0, len(entries), 2):
                        member = bytes(entries[i])
                        if member == _LAST_BYTES:
                            continue
                        owner = owner_id(records[member]) if member in records else _nonce_of(member)
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
                lease_id = _lease_of(member)
                if lease_id not in ttl_left:
                    key = self._lease_key(lease_id)
                    pttl, _ = self._request("read lease", key, "PTTL", key)
                    ttl_left[lease_id] = -2.0 if pttl == -2 else None if pttl < 0 else pttl / 1000
                if ttl_left[lease_id] != -2.0:
                    entries.append(Waiter(owner, token, lease_id, ttl_left[lease_id]))
                    kinds.append(kind_of(_nonce_of(member)))
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
class _Place(Position):
    """A waiting position, with the PTTL of the lease of the waiter ahead as the script read it (ms; -1: no
    expiry; ``_NOT_READ`` on a Cluster)."""

    ahead_ttl_ms: int = _NOT_READ


def _position(answer: list[Any]) -> Position:
    state = int(answer[1])
    if state == 2:
        return Position(held=False, gone=True)
    if state == 1:
        return _HELD
    return _Place(held=False, ahead=bytes(answer[2]), ahead_ttl_ms=int(answer[3]))


def _pack(args: tuple[Any, ...]) -> bytes:
    """One command in the Redis protocol, as redis-py's packer would write it for these argument types (bytes, str
    as UTF-8, int), in one piece: a sixth of an uncontended lock's client time went to redis-py's general packer."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode() if isinstance(arg, int) else arg.encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(parts)


def _shut_down(connection: Any) -> None:
    """End a blocked read on ``connection`` from another thread: shut its socket down, leave closing to the owner.

    The plain ``socket.shutdown`` (not ``SSLSocket``'s, which tears down TLS state the reading thread is using).
    redis-py has no public way to reach the socket; ``_sock`` is None when not connected.
    """
    sock = getattr(connection, "_sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
