"""What a lock handle shares with its client: the backend, the session keeper, and whether the client is open.

Every handle (lock, semaphore, read/write lock, multi-lock, election) is given a :class:`Context` by the
:class:`~distlock.Client` that made it, never the client itself; the rules that sit on the seam and have more than one
caller are written here once: a force release is a compare-and-delete of the head at the token the caller saw
(``Client.force_release`` and ``Lock.take_over``), an optional capability is refused where a user asks for it, and
a mark's arguments are checked (``Lock.write_mark``, ``Client.read_mark``).

Every call to the service goes through :meth:`Context.open_for`, which reports how it ended to the client's circuit
breaker (``_breaker``) and, for new work, asks it first: after a ``BackendUnavailable``, new work fails fast.

What can go wrong: every call on a closed client raises ``ClientClosed``, and so does a call under way in another
thread when the client closed, whatever the backend raised in that race (:meth:`Context.open_for`); new work while
the breaker is open raises ``BackendUnavailable`` at once; asking for a capability the backend lacks raises
``ConfigurationError`` with the backend's reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import cast

from . import _metrics
from ._breaker import DEFAULT_FAIL_FAST, Breaker
from ._errors import ClientClosed, ConfigurationError
from ._names import validate_name
from ._protocol import MARKS, RECORDS, Backend, Head, HeadWatching, Interrupt, Marking, Recording, Ticket
from ._seconds import seconds
from ._session import Keeper

__all__ = ["MAX_MARK_BYTES", "Context"]

#: The largest value of a mark: a small value (a state, a counter, a JSON object of a few fields).
MAX_MARK_BYTES = 65536


class Context:
    """A client's backend, keeper and circuit breaker, and its open/closed state, as its handles see them."""

    def __init__(self, backend: Backend, fail_fast: object = DEFAULT_FAIL_FAST) -> None:
        self.breaker = Breaker(fail_fast, _metrics.backend_label(type(backend).__module__))
        self.backend = backend
        self.keeper = Keeper(backend)
        self.closed = False

    @property
    def description(self) -> str:
        return self.backend.description

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosed(f"this distlock client ({self.description}) is closed")

    @contextlib.contextmanager
    def open_for(self, what: str, *, new_work: bool = True) -> Iterator[None]:
        """Run the block, a call to the service; an error it raises once the client is closed is a symptom of the
        close: ``ClientClosed``.

        ``Client.close()`` sets ``closed`` before it revokes anything or closes a connection, so an error caused by
        the close always finds it set. New work (not a release: ``new_work=False``) is refused at once while the
        breaker is open; every call tells the breaker how it ended.
        """
        try:
            with self.breaker.call(what, admit=new_work):
                yield
        except ClientClosed:
            raise
        except Exception as e:
            if not self.closed:
                raise
            raise ClientClosed(f"{what}: this distlock client ({self.description}) was closed meanwhile") from e

    def require(self, capability: str, what: str, *, kept: bool = True) -> None:
        """Refuse ``what`` (e.g. ``"semaphore 'jobs'"``) when the backend lacks ``capability``: declared
        ``unsupported``, or not ``kept`` (the backend lacks the capability's methods)."""
        reason = self.backend.unsupported.get(capability) or (None if kept else f"it keeps no {capability}")
        if reason is not None:
            raise ConfigurationError(f"{what} is not available on {self.description}: {reason}")

    def records(self, what: str) -> Recording:
        """The backend's records, for ``what`` (an election); ``ConfigurationError`` when it keeps none."""
        self.require(RECORDS, what, kept=isinstance(self.backend, Recording))
        return cast(Recording, self.backend)

    def marks(self, what: str) -> Marking:
        """The backend's marks, for ``what``; ``ConfigurationError`` when it keeps none."""
        self.require(MARKS, what, kept=isinstance(self.backend, Marking))
        return cast(Marking, self.backend)

    def mark_writer(self, name: str, key: str, value: bytes, ttl: float) -> Callable[[Ticket], bool]:
        """``Lock.write_mark``'s write of mark ``key`` of lock ``name`` (``Marking.write_mark`` of a held ticket),
        its arguments checked first; ``ConfigurationError`` for a bad one or a backend that keeps no marks."""
        validate_name(key, "mark key")
        if not isinstance(value, bytes) or len(value) > MAX_MARK_BYTES:
            shown = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
            raise ConfigurationError(f"a mark's value must be bytes, at most {MAX_MARK_BYTES} of them, not {shown}")
        ttl = seconds(ttl, "ttl (how long the mark is kept)")
        marks = self.marks(f"mark {key!r} of lock {name!r}")
        return lambda ticket: marks.write_mark(ticket, key, value, ttl)

    def read_mark(self, name: str, key: str) -> bytes | None:
        """Mark ``key`` of lock ``name`` (``Client.read_mark``), None when none was written or it expired."""
        validate_name(name)
        validate_name(key, "mark key")
        marks = self.marks(f"mark {key!r} of lock {name!r}")
        with self.open_for(f"read mark {key!r} of lock {name!r}"):
            return marks.read_mark(name, key)

    def head(self, name: str) -> Head | None:
        with self.open_for(f"read lock {name!r}"):
            return self.backend.head(name)

    def watch_head(self, name: str, seen: Ticket | None, timeout: float, interrupt: Interrupt) -> bool:
        """Wait up to ``timeout`` s for lock ``name``'s head to change from ``seen`` (``HeadWatching.watch_head``);
        False at once when the backend has no watch, and the caller waits its poll period instead."""
        if not isinstance(self.backend, HeadWatching):
            return False
        with self.open_for(f"watch lock {name!r}"):
            self.backend.watch_head(name, seen, timeout, interrupt)
        return True

    def release_at(self, name: str, token: int) -> bool:
        """Remove lock ``name``'s head if its token is still ``token``; False when nobody holds it or another does.

        Read the head, then remove that ticket with the backend's compare-and-delete (same key, same token). The head
        stops being the head only by being removed (every later entry has a larger token), so a holder that released
        meanwhile, and the waiter that took over, fail the compare: a newer holder is never touched. A release racing
        this is the same compare-and-delete of one key at one token, so whichever comes second finds nothing to do.
        """
        head = self.head(name)
        if head is None or head.ticket.token != token:
            return False
        with self.open_for(f"force-release lock {name!r}"):
            return self.backend.dequeue(head.ticket)
