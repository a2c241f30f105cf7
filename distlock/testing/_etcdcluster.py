"""Throwaway real etcd cluster for tests: `EtcdCluster`, several `EtcdServer` members on loopback started together.

Import it from `distlock.testing`. The members are ordinary `EtcdServer`s (``_etcd``) joined by a static
``--initial-cluster``: a test kills, stops, pauses and restarts them one by one, and ``restore()`` brings back every
member it took down. ``leader_index()`` asks the members' metrics (no gRPC) which one leads; ``metrics()`` and
``rpc_count()`` sum over the live members. ``url`` names all members (``etcd://p1,p2,p3``).

What can go wrong:

- A lone member of three cannot become healthy: the members start (and ``restore()`` relaunches them) together.
- No single leader within ``start_timeout`` (or a member not healthy): `EtcdStartError` with each waiting member's
  log tail. A port taken between choosing and binding is retried with new ports for all members, from empty data
  directories; ``leader_index()`` raises `HarnessError` while an election is under way.
- ``close()`` kills the members at once: stopping them one by one gracefully would leave the last waiting for a
  quorum that is gone.
"""

from __future__ import annotations

import http.client
import time
import uuid
from collections.abc import Sequence

from distlock._errors import ConfigurationError
from distlock.testing._base import _HOST, _PORT_ATTEMPTS, HarnessError, _Managed, _PortInUse
from distlock.testing._etcd import EtcdServer, EtcdStartError, _Ports, _TlsFiles

__all__ = ["EtcdCluster"]


class EtcdCluster(_Managed):
    """A real etcd cluster of ``size`` members on loopback, with a static ``--initial-cluster``.

    ``members[i]`` is an `EtcdServer`: kill, stop, pause, resume and restart members one by one (a restarted
    member rejoins with its data); ``restore()`` brings back every member a test took down. ``close()``
    removes everything. ``binary`` is the etcd all members run (default `find_etcd()`).
    """

    def __init__(
        self,
        size: int = 3,
        *,
        tls: bool = False,
        heartbeat_interval_ms: int = 50,
        election_timeout_ms: int = 500,
        unsafe_no_fsync: bool = True,
        start_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        if size < 1:
            raise ConfigurationError(f"an etcd cluster needs at least one member, not {size}")
        self._start_timeout = start_timeout
        self._token = f"distlock-{uuid.uuid4().hex[:12]}"
        self.members: list[EtcdServer] = []
        try:
            for index in range(size):
                self.members.append(
                    EtcdServer(
                        name=f"distlock-m{index}",
                        heartbeat_interval_ms=heartbeat_interval_ms,
                        election_timeout_ms=election_timeout_ms,
                        unsafe_no_fsync=unsafe_no_fsync,
                        start_timeout=start_timeout,
                        extra_args=extra_args,
                        binary=binary,
                    )
                )
            self._tls = _TlsFiles.generate(self.members[0].base_dir / "tls") if tls else None
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start all members at once and wait until each is healthy and there is a leader."""
        for attempt in range(_PORT_ATTEMPTS):
            ports = [_Ports.pick() for _ in self.members]
            initial_cluster = ",".join(
                f"{member.name}=http://{_HOST}:{p.peer}" for member, p in zip(self.members, ports, strict=True)
            )
            for member, member_ports in zip(self.members, ports, strict=True):
                member._configure_member(member_ports, initial_cluster, self._token, self._tls)
            try:
                for member in self.members:
                    member._launch()
                self._wait_healthy(self.members)
            except _PortInUse:
                for member in self.members:
                    member.kill()
                    member._discard_failed_start()
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                for member in self.members:
                    member.kill()
                raise
            else:
                return

    def restore(self) -> None:
        """Resume paused members, restart stopped or killed ones, wait until all are healthy with a leader."""
        down = []
        for member in self.members:
            if member.paused:
                member.resume()
            elif not member.running:
                down.append(member)
        # Launch first, wait after: two members down in three cannot become healthy one at a time.
        for member in down:
            member._launch()
        self._wait_healthy(self.members)

    def close(self) -> None:
        """Stop all members and remove their directories. Safe to call twice."""
        for member in self.members:
            member.kill()  # not one by one gracefully: the last members would wait for a quorum that is gone
        for member in self.members:
            member.close()

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.members!r}>"

    @property
    def endpoints(self) -> list[str]:
        """``127.0.0.1:<port>`` of every member."""
        return [member.endpoint for member in self.members]

    @property
    def url(self) -> str:
        """The distlock URL of all members: ``etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        hosts = ",".join(self.endpoints)
        if self._tls is None:
            return f"etcd://{hosts}"
        return f"etcds://{hosts}{self._tls.url_query()}"

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def version(self) -> tuple[int, int, int]:
        """The etcd release the members run, e.g. ``(3, 4, 23)``."""
        return self.members[0].version

    def leader_index(self) -> int:
        """Index in ``members`` of the raft leader, as the live members report it (their metrics; no gRPC).

        Raises `HarnessError` while there is no single leader (an election is under way).
        """
        leaders = [index for index, member in enumerate(self.members) if self._reports_leader(member)]
        if len(leaders) != 1:
            raise HarnessError(f"no single leader among the live members: {leaders or 'none'} say they lead")
        return leaders[0]

    @property
    def leader(self) -> EtcdServer:
        return self.members[self.leader_index()]

    def wait_for_leader(self, timeout: float = 10.0) -> int:
        """Wait until the live members have one leader; return its index."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader_index()
            except HarnessError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    @staticmethod
    def _reports_leader(member: EtcdServer) -> bool:
        if not member.running or member.paused:
            return False
        try:
            return member.is_leader(timeout=1.0)
        except (OSError, http.client.HTTPException, HarnessError):
            return False

    def metrics(self) -> dict[str, float]:
        """Every metric summed over the live (running, not paused) members."""
        total: dict[str, float] = {}
        for member in self._live():
            for key, value in member.metrics().items():
                total[key] = total.get(key, 0.0) + value
        return total

    def rpc_count(self) -> int:
        """gRPC messages received, summed over the live members (see `EtcdServer.rpc_count`)."""
        return sum(member.rpc_count() for member in self._live())

    def _live(self) -> list[EtcdServer]:
        return [member for member in self.members if member.running and not member.paused]

    def _wait_healthy(self, members: Sequence[EtcdServer]) -> None:
        deadline = time.monotonic() + self._start_timeout
        waiting = list(members)
        while waiting:
            waiting = [member for member in waiting if not member._poll_ready()]
            if waiting and time.monotonic() > deadline:
                logs = "\n".join(f"--- {m.name} ({m.log_path}):\n{m.log_tail(1500)}" for m in waiting)
                raise EtcdStartError(
                    f"etcd members {[m.name for m in waiting]} were not healthy within "
                    f"{self._start_timeout:g} s.\n{logs}"
                )
            if waiting:
                time.sleep(0.05)
        self.wait_for_leader(max(1.0, deadline - time.monotonic()))
