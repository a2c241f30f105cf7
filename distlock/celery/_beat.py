"""Celery beat on a leader: run ``celery beat`` on every host; only the elected one sends, and each run once.

    app.conf.beat_scheduler = "distlock.celery:LeaderScheduler"  # or: celery beat -S distlock.celery:LeaderScheduler
    app.conf.distlock_beat_ttl = 10                               # optional: seconds a silent leader keeps leading
    app.conf.distlock_beat_election = "celery-beat:proj"          # optional: default "celery-beat:<app.main>"

Each beat is a candidate in one ``client.election``; a standby ticks every second and sends nothing. On taking
office the leader reads the election's record, the *ledger* (each entry's last run and run number), and continues
from it; before each send it writes the run there with ``election.record()``, which the lock service accepts only
while it still leads, and sends it with the header ``distlock_beat_tick`` = ``"<entry>#<run number>"``. Why no run
is sent twice, across failovers and frozen leaders: docs/integrations/celery.md, "Beat on a leader".

Each tick of the leader runs in the election's stop-on-loss scope (``election.scope()``, in the main thread): when
it learns it was deposed (its lease lapsed while it was frozen, or the lock was force-released), ``LockLost`` stops
the tick at once, and the next tick makes it a candidate again.

What can go wrong: at most once, not exactly once (a leader killed, or deposed, between its ledger write and the
broker's acknowledgement, a send the broker refuses, or a ledger write whose answer was lost loses that run; logged). A
failover takes up to the TTL plus one tick. An unreachable lock service stops the sending (logged) until it is back;
a malformed ledger is logged and replaced. A bad TTL or a non-str election name raises ``ConfigurationError`` when
the scheduler is created; a name that cannot name a lock, ``InvalidLockName`` at the first tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import os
import socket
import threading
from datetime import datetime
from typing import Any

from celery.beat import ScheduleEntry, Scheduler

import distlock
from distlock import BackendError, ClientClosed, ConfigurationError, DistlockError, LockLost, LockNotOwned, seconds

from ._config import get_client

__all__ = ["LeaderScheduler"]

log = logging.getLogger("distlock.celery.beat")

#: The header of every message the leader sends: ``"<entry name>#<run number>"``, the same in every beat process.
TICK_HEADER = "distlock_beat_tick"
#: The header with the sending leader's term (its fencing token).
TERM_HEADER = "distlock_beat_term"


class _Candidacy:
    """One beat's candidacy: an election and the thread that waits, in the election's queue, for its turn to lead.

    The wait is the asyncio twin's ``campaign()`` on an event loop of the thread's own, because an asyncio campaign
    can be cancelled (``end()``) without leaving and rejoining the queue now and then.
    """

    def __init__(self, client: distlock.Client, name: str, ttl: float) -> None:
        # family: the metrics of the beat's lock (a deposed leader counts in distlock.lock.lost) under the election.
        self.election = client.election(name, value=f"{socket.gethostname()}:{os.getpid()}", ttl=ttl, family=name)
        self._loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"distlock-beat-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # end() cancelled the campaign
            self._loop.run_until_complete(self._campaign())

    async def _campaign(self) -> None:
        candidate = distlock.AsyncElection(self.election)
        while not self._stopped.is_set():
            try:
                if await candidate.campaign(timeout=math.inf):
                    log.info("distlock beat: leading %r in term %d", self.election.name, self.election.term)
                    return
            except ClientClosed:
                return
            except DistlockError as e:
                log.warning("distlock beat: campaign for %r failed (%s); trying again", self.election.name, e)
                await asyncio.sleep(1.0)

    def end(self) -> None:
        """Stop waiting, and resign when leading (the next candidate leads at once)."""
        self._stopped.set()

        def cancel() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):  # the loop has already finished
            self._loop.call_soon_threadsafe(cancel)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        with contextlib.suppress(LockLost, LockNotOwned, DistlockError):
            self.election.resign()


class LeaderScheduler(Scheduler):
    """A beat scheduler that sends only while it leads the election, recording each run before it sends it.

    See the module documentation for the settings and the guarantees. The schedule comes from
    ``app.conf.beat_schedule`` as for beat's own scheduler; its state lives in the election's ledger, not in a
    local file.
    """

    #: Seconds between the ticks of a beat that does not lead: how soon after it wins the election it sends.
    standby_interval = 1.0

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        conf = app.conf
        self._ttl = seconds(conf.get("distlock_beat_ttl", 10.0), "distlock_beat_ttl (the leader's lease)")
        name = conf.get("distlock_beat_election") or f"celery-beat:{app.main}"
        if not isinstance(name, str):
            raise ConfigurationError(f"distlock_beat_election must be a str (a lock name), not {name!r}")
        self._name = name
        self._candidacy: _Candidacy | None = None
        self._term: int | None = None
        self._ledger: dict[str, dict[str, Any]] = {}
        super().__init__(app, *args, **kwargs)

    @property
    def info(self) -> str:
        return f"    . election -> {self._name} (ttl {self._ttl:g} s; sends only while leading)"

    # -- leading --------------------------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._leading():
            return min(self.standby_interval, float(self.max_interval or self.standby_interval))
        assert self._candidacy is not None  # _leading() made it
        election = self._candidacy.election
        try:
            with _stopped_on_loss(election):
                return float(super().tick(*args, **kwargs))
        except LockLost as e:
            # Lost mid-tick: the entries not yet sent stay unsent (each would be refused at its ledger write anyway);
            # the next tick, at once, finds this beat deposed and makes it a candidate again.
            log.warning("distlock beat: lost %r in term %s mid-tick (%s); stopped sending", self._name, self._term, e)
            return 0.0

    def _leading(self) -> bool:
        """True while this beat leads and has read the ledger of its term; starts or restarts the campaign."""
        candidacy = self._candidacy
        if candidacy is None:
            candidacy = self._candidacy = _Candidacy(get_client(self.app), self._name, self._ttl)
        election = candidacy.election
        if election.is_leader():
            if election.term != self._term:
                try:
                    self._take_office(election)
                except BackendError as e:
                    log.error("distlock beat: cannot read the ledger of %r (%s); not sending yet", self._name, e)
                    return False
                self._term = election.term
            return True
        if self._term is not None or election.lost:
            log.warning("distlock beat: no longer leading %r (term %s); a candidate again", self._name, self._term)
            self._term = None
            candidacy.end()
            self._candidacy = _Candidacy(get_client(self.app), self._name, self._ttl)
        return False

    def _take_office(self, election: distlock.Election) -> None:
        """Continue every entry from the ledger the last leader left (read after this term began: no write of an
        earlier leader can come after it)."""
        raw = election.recorded()
        ledger: dict[str, dict[str, Any]] = {}
        if raw is not None:
            try:
                ledger = _parse_ledger(raw)
            except ValueError as e:
                log.error("distlock beat: the ledger of %r is malformed (%s); starting afresh", self._name, e)
        for name, entry in self.schedule.items():
            done = ledger.get(name)
            if done is not None:
                entry.last_run_at = datetime.fromisoformat(done["last_run_at"])
                entry.total_run_count = int(done["runs"])
        self._ledger = ledger
        self._heap = None  # the next tick orders the entries again, by their new last runs
        log.info("distlock beat: term %d of %r, %d entries from the ledger", election.term, self._name, len(ledger))

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        # ``tick`` has just advanced the schedule (``reserve``): its entry of this name is this run.
        name = str(entry.name)
        run = self.schedule.get(name, entry)
        last_run_at = run.last_run_at or self.app.now()
        ledger = {**self._ledger, name: {"last_run_at": last_run_at.isoformat(), "runs": run.total_run_count}}
        tick = f"{name}#{run.total_run_count}"
        candidacy = self._candidacy
        try:
            if candidacy is None:
                raise LockNotOwned("not a candidate")
            self._record(candidacy.election, json.dumps(ledger, sort_keys=True))
        except (LockLost, LockNotOwned) as e:
            log.warning("distlock beat: %s not sent: no longer leading %r (%s)", tick, self._name, e)
            return
        except DistlockError as e:
            log.error("distlock beat: %s not sent: the ledger write failed (%s), and it may have landed", tick, e)
            return
        self._ledger = ledger
        tagged = copy.copy(entry)
        options: dict[str, Any] = dict(entry.options or {})
        options["headers"] = {**options.get("headers", {}), TICK_HEADER: tick, TERM_HEADER: self._term}
        tagged.options = options
        super().apply_entry(tagged, producer=producer)

    def _record(self, election: distlock.Election, ledger: str) -> None:
        """Write the ledger, refused by the service unless this beat still leads."""
        election.record(ledger)

    # -- stopping -------------------------------------------------------------------------------------------

    def close(self) -> None:
        candidacy, self._candidacy = self._candidacy, None
        if candidacy is not None:
            candidacy.end()
        super().close()


def _stopped_on_loss(election: distlock.Election) -> contextlib.AbstractContextManager[None]:
    """The election's stop-on-loss scope around a tick in the main thread (``celery beat``): a loss raises
    ``LockLost`` in it at once. In another thread (a beat embedded in a worker with ``-B`` on a thread) no signal
    reaches the tick: the ledger write still refuses every run a deposed leader would send."""
    if threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return election.scope()


def _parse_ledger(raw: bytes) -> dict[str, dict[str, Any]]:
    ledger = json.loads(raw)
    if not isinstance(ledger, dict):
        raise ValueError("not a JSON object")
    for name, done in ledger.items():
        if not isinstance(done, dict) or not isinstance(done.get("runs"), int):
            raise ValueError(f"entry {name!r} has no run count")
        if not isinstance(done.get("last_run_at"), str):
            raise ValueError(f"entry {name!r} has no last run")
        datetime.fromisoformat(done["last_run_at"])
    return ledger
