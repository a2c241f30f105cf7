"""The names of the Redis backend's keys and queue members, under one key prefix (the layout and why it is so:
docs/operations/redis.md, "How it works").

Every key of lock ``N`` starts ``<prefix>:{E}:`` (``E``: the name escaped by ``_names.escape_name``, braces
included), so that a lock's keys share one Redis Cluster slot (its marks too: ``<prefix>:{E}:mark:<escaped key>``,
braces escaped, so that no mark matches the pattern of the queue keys); a client's lease key is
``<prefix>:lease:<hex>``. A queue member is ``<lease hex>-3.<nonce>``: the lease that keeps it alive, the layout mark
:data:`LAYOUT_MARK` (the keys expire and are deleted with their last entry; earlier layouts' members have no mark,
and the clients of each refuse to queue behind the other's: see docs/operations/redis.md, "Upgrading"), and the
waiter's nonce (with its kind, for a semaphore's or read/write lock's entry).

What can go wrong: nothing raises here; a malformed member reads as lease 0, which never exists.
"""

from __future__ import annotations

from ..._names import escape_name, unescape_name
from ..._protocol import default_owner

__all__ = ["LAYOUT_MARK", "Keys", "lease_of", "member_of", "nonce_of", "owner_of"]

#: What follows ``<lease hex>-`` in a member of this key layout, before a dot. An earlier client reads it as the
#: member's kind, of a family of its own, so it refuses to queue behind it (``LockKindMismatch``).
LAYOUT_MARK = "3"
_MARK = f"{LAYOUT_MARK}.".encode()

#: Besides ``/``, braces are escaped in lock names: a brace would end the ``{hash tag}`` that keeps a lock's keys in
#: one Cluster slot.
_RESERVED = "/{}"


class Keys:
    """The key names of one backend, under its ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: What goes before a lease's hex id to name its key (and what the scripts put before a member's).
        self.lease_prefix = f"{prefix}:lease:"
        #: A ``SCAN MATCH`` pattern of every queue key.
        self.queues = f"{prefix}:{{*}}:q"

    def lease(self, lease_id: int) -> str:
        return f"{self.lease_prefix}{lease_id:x}"

    def lock(self, name: str) -> str:
        """The common start of every key of lock ``name``: ``<prefix>:{<escaped>}:``."""
        return f"{self.prefix}:{{{escape_name(name, _RESERVED)}}}:"

    def mark(self, name: str, key: str) -> str:
        """The key of mark ``key`` of lock ``name``: in the lock's slot, never ending ``}:q`` as a queue key does."""
        return f"{self.lock(name)}mark:{escape_name(key, _RESERVED)}"

    def name_of(self, key: str) -> str | None:
        """The lock name of a queue key ``<prefix>:{<escaped>}:q`` (None for a key that is not one)."""
        start = f"{self.prefix}:{{"
        if not (key.startswith(start) and key.endswith("}:q")):
            return None
        return unescape_name(key[len(start) : -3])


def member_of(lease_id: int, nonce: str) -> bytes:
    """The queue member of a waiter: ``<lease hex>-3.<nonce>``."""
    return f"{lease_id:x}-{LAYOUT_MARK}.{nonce}".encode("ascii")


def lease_of(member: bytes) -> int:
    """The lease id in a queue member ``<lease hex>-<nonce>`` (0, a lease that never exists, if malformed)."""
    try:
        return int(member.split(b"-", 1)[0], 16)
    except ValueError:
        return 0


def nonce_of(member: bytes) -> str:
    """The waiter's nonce (its seat, with its kind)."""
    tail = member.split(b"-", 1)[-1]
    return tail.removeprefix(_MARK).decode("ascii", "replace")


def owner_of(member: bytes) -> str:
    """The owner id of a waiter given none (``_protocol.default_owner``), which it stores no record of."""
    return default_owner(lease_of(member), nonce_of(member))
