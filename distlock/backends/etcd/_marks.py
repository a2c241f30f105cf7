"""The leases that expire the etcd backend's marks (``Marking``): etcd keeps no TTL per key, only per lease.

A mark is put on a lease granted for its TTL, and etcd deletes it with the lease: no sweeper. Granting one lease per
mark would cost a second request per write and leave one lease per live mark on the cluster (a Celery worker marks
every task: a day's retention of a busy queue is millions of leases, each revoked by the leader one by one when
it expires). So a lease is shared by the marks whose expiry falls within its *slack*, a tenth of their TTL (at least
a second): :meth:`MarkLeases.lease_for` hands out the lease of this TTL while it still has at least ``ttl`` to run,
and grants ``ttl`` plus the slack otherwise. A mark then lives from ``ttl`` to ``ttl`` plus the slack, and a process
grants about ten leases per TTL of each mark TTL it uses. Mark leases are never refreshed nor revoked (closing the
client leaves its marks).

What can go wrong: a lease revoked by hand, or gone with a restored snapshot, makes a write raise ``LeaseGone``; the
caller forgets it (:meth:`MarkLeases.forget`) and asks for a new one. A lease is granted at least for what etcd's
minimum TTL allows (about two seconds): shorter marks live that long.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ... import _clock
from ..._protocol import Lease

__all__ = ["MarkLeases", "slack_of"]


def slack_of(ttl: float) -> float:
    """How much longer than ``ttl`` a mark may live: a tenth of it, at least a second (etcd counts whole seconds)."""
    return max(ttl / 10, 1.0)


class MarkLeases:
    """The leases this process put marks on, one per mark TTL, with when each expires at the earliest."""

    def __init__(self, grant: Callable[[float], Lease]) -> None:
        self._grant = grant
        self._leases: dict[float, tuple[int, float]] = {}  # mark TTL -> (lease id, earliest expiry on our clock)

    def lease_for(self, ttl: float) -> int:
        """A lease that expires at least ``ttl`` s from now and at most ``slack_of(ttl)`` after that."""
        lease = self._leases.get(ttl)
        if lease is not None and lease[1] >= _clock.now() + ttl:
            return lease[0]
        sent = _clock.now()  # the lease's time runs from etcd's grant, after this: its expiry is no earlier
        granted = self._grant(math.ceil(ttl + slack_of(ttl)))
        self._leases[ttl] = (granted.id, sent + granted.ttl)
        return granted.id

    def forget(self, lease_id: int) -> None:
        """Stop handing out ``lease_id`` (it is gone)."""
        self._leases = {ttl: lease for ttl, lease in self._leases.items() if lease[0] != lease_id}
