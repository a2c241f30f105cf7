"""Watches on an etcd queue: a waiter's watch stream, what its answers mean, and the probe of silent members.

``Watches.follow`` opens a watch stream on the preferred member and hands each answer to a handler: the watch on the
one key ahead (``ahead_watch``) or, for a semaphore waiter, the watch on the whole queue (``SemaphoreWatch``). It
returns the handler's position, or None when the caller must read its place again: the watch was refused, compacted,
cancelled, timed out, interrupted, or its member went away. With several members, ``ProgressProbe`` asks each
watched member for a progress report and cancels a watch whose member stays silent.

What can go wrong: a member with no leader or one that stops answering (the watch ends, the member loses the
preference, the caller's next read goes elsewhere); an expired auth token (renewed, then None); any other gRPC
error is translated by ``Channels.translate`` and raised. Why the watch starts at "now" and reads again:
docs/operations/etcd.md ("How it works").
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from etcd3 import etcdrpc

from ... import _clock
from ..._protocol import Interrupt, Position, Ticket
from ._channels import RETRYABLE, Channels, Member, closed_channel, details_of, status_of

__all__ = ["Handler", "PositionAtRevision", "SemaphoreWatch", "Watches", "ahead_watch"]

#: A handler of a watch's answers: the position to return (None: read the queue again), or False to go on watching.
Handler = Callable[[Any], Position | bool | None]

#: The probe asks each watched member for a progress report this often, and cancels a watch whose member has
#: said nothing for ``WATCH_SILENCE`` s.
PROBE_EVERY = 0.2
WATCH_SILENCE = 0.6


@dataclass(frozen=True)
class PositionAtRevision(Position):
    """A waiting position, with the store ``revision`` it was read at: a watch that starts later reads again."""

    revision: int = 0


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
    member: Member
    responses: Any
    requests: _Requests
    heard: float
    probed: float


class ProgressProbe:
    """Cancels watches whose member stopped answering, found by asking it for progress (several members only).

    A frozen member keeps its TCP connections open and answers nothing: a watch on it would wait for a release it
    never reports, and gRPC's own keep-alive pings may not be sent more often than every few seconds (etcd refuses
    clients that ping faster). So one thread per client sends each watch a progress request (etcd answers it at
    once, from the member itself) every ``PROBE_EVERY`` s, and cancels a watch that has heard nothing for
    ``WATCH_SILENCE`` s, failing its member over. The thread runs only while there are watches.
    """

    def __init__(self, fail_over: Callable[[Member], None]) -> None:
        self._fail_over = fail_over
        self._mutex = threading.Lock()
        self._watched: set[_Watched] = set()
        self._running = False

    def watch(self, member: Member, responses: Any, requests: _Requests) -> _Watched:
        now = _clock.now()
        watched = _Watched(member, responses, requests, heard=now, probed=now)
        with self._mutex:
            self._watched.add(watched)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="distlock-etcd-probe", daemon=True).start()
        return watched

    def forget(self, watched: _Watched) -> None:
        with self._mutex:
            self._watched.discard(watched)

    def _run(self) -> None:
        progress = etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())
        while True:
            time.sleep(PROBE_EVERY)
            with self._mutex:
                if not self._watched:
                    self._running = False
                    return
                watched = list(self._watched)
            now = _clock.now()
            for each in watched:
                if now - each.heard > WATCH_SILENCE:
                    self.forget(each)
                    self._fail_over(each.member)
                    each.responses.cancel()
                elif now - each.probed >= PROBE_EVERY:
                    each.probed = now
                    each.requests.send(progress)


class SemaphoreWatch:
    """A semaphore waiter's watch on its queue: counts the deletions of keys ahead of it, and reads its place again
    once fewer than its limit can be ahead (or its own key went)."""

    def __init__(
        self, read_place: Callable[[], Position], ticket: Ticket, position: Position, read_at: int, limit: int
    ) -> None:
        self._read_place = read_place
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
                return self._read_place()
            if int(event.prev_kv.create_revision) < self._ticket.token:
                self._ahead -= 1
        return self._read() if self._ahead < self._limit else False

    def _read(self) -> Position | bool:
        now = self._read_place()
        if now.held or now.gone or not isinstance(now, PositionAtRevision):
            return now
        self._ahead, self._read_at = now.waiters_ahead, now.revision
        return False


def ahead_watch(read_place: Callable[[], Position], position: Position, read_at: int, response: Any) -> Position | bool:
    """One answer of the watch on the key ahead: the position to return, or False to go on watching."""
    if response.created:
        if int(response.header.revision) > read_at:
            now = read_place()
            if now.held or now.gone or now.ahead != position.ahead:
                return now
        return False
    if response.events:
        # The key ahead is gone: where do we stand now? Our own key is read again, too (a waiter whose lease was
        # revoked while it waited must not take its turn), in the copy of the member that reported the deletion.
        return read_place()
    return False


class Watches:
    """Watch streams on one cluster's members, each probed for silence while it runs (with several members)."""

    def __init__(self, channels: Channels) -> None:
        self._channels = channels
        self._probe = ProgressProbe(channels.fail_over)

    def after_fork(self) -> None:
        self._probe = ProgressProbe(self._channels.fail_over)

    def follow(
        self,
        member: Member,
        create: Any,
        handle: Handler,
        timeout: float | None,
        interrupt: Interrupt,
        what: str,
    ) -> Position | None:
        """Watch on ``member`` with ``create`` until ``handle`` answers a position or None, or the watch ends (None).

        A watch must not hang on a member that cannot tell us about the release: ``hasleader`` asks etcd to cancel
        it when the member has no leader (cut off from the quorum; the Go client's WithRequireLeader), and with
        several members the probe asks the member for a progress report every few hundred milliseconds and
        cancels the watch when it stays silent (a frozen member answers nothing, not even a cancel). Either way
        this returns, the member loses the preference, and the caller's next read goes to another member.
        """
        channels = self._channels
        requests = _Requests(etcdrpc.WatchRequest(create_request=create))
        started = _clock.now()
        try:
            responses = member.watch.Watch(requests, timeout=timeout, metadata=channels.metadata(require_leader=True))
        except ValueError as e:
            requests.close()
            if not closed_channel(e):
                raise
            return None  # the caller's next read reports the closed client
        unregister = interrupt.on_fire(responses.cancel)
        watched = self._probe.watch(member, responses, requests) if len(channels.endpoints) > 1 else None
        try:
            for response in responses:
                if watched is not None:
                    watched.heard = _clock.now()
                if response.canceled or response.compact_revision:
                    if response.canceled and "no leader" in response.cancel_reason:
                        channels.fail_over(member)
                    return None  # refused, or compacted: read the queue again
                outcome = handle(response)
                if outcome is not False:
                    return outcome  # type: ignore[return-value]
        except grpc.RpcError as e:
            code = status_of(e)
            details = details_of(e)
            timed_out = timeout is not None and _clock.now() - started >= timeout - 0.05
            # Our deadline or cancel (the interrupt's, or the probe's for a silent member) can surface as the
            # server's own "context deadline exceeded/canceled" (UNKNOWN).
            if (
                interrupt.fired
                or timed_out
                or code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
                or "context deadline exceeded" in details
                or "context canceled" in details
            ):
                return None
            if code in RETRYABLE:
                # The member went away mid-watch, or has no leader. Move on, and pause briefly so a dead cluster is
                # not spun on; the caller's next read retries across members and raises if the cluster stays away.
                channels.fail_over(member)
                pause = 0.05 if timeout is None else min(0.05, max(timeout - (_clock.now() - started), 0))
                time.sleep(pause)
                return None
            if channels.recover(e, _clock.now() + channels.request_timeout):  # an expired auth token, renewed
                return None
            raise channels.translate(e, what) or e from e
        finally:
            if watched is not None:
                self._probe.forget(watched)
            unregister()
            responses.cancel()
            requests.close()
        return None  # the stream ended without an answer: read the queue again
