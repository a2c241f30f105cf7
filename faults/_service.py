"""The lock service under test, as one interface: `Service`, with one implementation per service (``_etcd``:
a 3-member etcd cluster; ``_servers``: Redis, ZooKeeper, the PostgreSQL lock table).

A service is a context manager that starts its servers and closes them; it names the distlock URL the workers use,
the faults it supports by name (``holder-pause``, done by the `Nemesis` on the workers, is one of every service's),
and does one of them (`Service.do`) for a duration, undoing whatever a fault left with `Service.undo`. Class
attributes say what the runner needs before anything starts: the service's ``name`` (what ``Case.service`` says),
its ``faults``, the fault its control runs use (one that makes a stale holder write), which faults must outlast the
TTL (a frozen holder's lease must lapse) or end within it, and a caveat for its report section.

What can go wrong: a fault the service does not support is a `HarnessError` from `Service.do`; a fault that needs
what this machine lacks (root, nft) is one from `Service.check`, which the runner calls before starting anything.
``label`` and ``setup`` (the report's section title and first line) are known once the service has started.
"""

from __future__ import annotations

import abc
import subprocess
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Generic, Self, TypeVar

from distlock.testing import HarnessError, PostgresServer, RedisServer, ZooKeeperServer
from faults._nemesis import HOLDER_PAUSE

if TYPE_CHECKING:
    from faults._nemesis import Nemesis

__all__ = ["OneServer", "Service", "first_line"]


def first_line(command: Sequence[str]) -> str:
    """The first line ``command`` prints (on stdout, else stderr): a server's ``--version``."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr or "unknown").splitlines()[0]


class Service(abc.ABC):
    """A lock service under test: started by ``with``, faults done on it by name."""

    name: ClassVar[str]
    faults: ClassVar[tuple[str, ...]]  # every fault it supports, holder-pause included
    control: ClassVar[str] = HOLDER_PAUSE  # the control runs' fault: one that makes a stale holder write
    outlast_ttl: ClassVar[frozenset[str]] = frozenset({HOLDER_PAUSE})
    within_ttl: ClassVar[frozenset[str]] = frozenset()
    caveat: ClassVar[str] = ""

    label = ""  # the report's section: "etcd 3.5.1", "Redis 7.0.15"; set by start()
    setup = ""  # what runs, for the section's first line; set by start()

    def __init__(self, faults: Sequence[str] = ()) -> None:
        """``faults``: the ones that will be done (a service may need to prepare for some)."""
        self.planned = tuple(faults)

    @classmethod
    def check(cls, faults: Sequence[str]) -> None:
        """Raise `HarnessError` if one of ``faults`` cannot be done on this machine (every one can, by default)."""
        return None

    @classmethod
    def duration(cls, fault: str, duration: float, ttl: float) -> float:
        """How long ``fault`` lasts when faults last ``duration`` s and leases ``ttl`` s."""
        if fault in cls.outlast_ttl:
            return max(duration, ttl + 2.0)
        if fault in cls.within_ttl:
            return min(duration, ttl)
        return duration

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The distlock URL the workers lock through."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every server and remove its files; safe after a failed start."""

    @abc.abstractmethod
    def undo(self) -> None:
        """Undo whatever a fault left: every server running and continued, no partition."""

    @abc.abstractmethod
    def _do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        """Do one of this service's own faults (not holder-pause); a note for the report."""

    def do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        """Do ``fault`` for ``duration`` s (``nemesis`` acts on the workers); a note for the report. The caller
        undoes it (`undo`), also when it fails half-way."""
        if fault not in self.faults:
            raise HarnessError(f"{fault!r} is not a fault of {self.name} (its faults: {', '.join(self.faults)})")
        return nemesis.holder_pause(duration) if fault == HOLDER_PAUSE else self._do(fault, duration, nemesis)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


_Server = TypeVar("_Server", RedisServer, ZooKeeperServer, PostgresServer)


class OneServer(Service, Generic[_Server]):
    """A service of one server process (Redis, ZooKeeper, PostgreSQL): killed and started again, or paused."""

    server: _Server | None = None

    @property
    def process(self) -> _Server:
        """The server, once started."""
        if self.server is None:
            raise HarnessError(f"{self.name} is not started")
        return self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def undo(self) -> None:
        server = self.process
        if server.paused:
            server.resume()
        elif not server.running:
            server.start()

    def restart_after(self, duration: float) -> str:
        """SIGKILL the server and start it again after ``duration`` s, with its data."""
        self.process.kill()
        time.sleep(duration)
        self.process.start()
        return f"SIGKILL, started again after {duration:g} s"

    def pause_for(self, duration: float) -> str:
        """SIGSTOP the server (and its children) for ``duration`` s, then SIGCONT."""
        self.process.pause()
        time.sleep(duration)
        self.process.resume()
        return f"SIGSTOP for {duration:g} s, SIGCONT"
