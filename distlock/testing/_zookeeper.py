"""Throwaway real ZooKeeper for tests: `ZooKeeperServer` (one standalone server) and `ZooKeeperEnsemble`.

Import them from `distlock.testing`. Each server is Debian's ``zookeeper`` package run directly with ``java``, on
free loopback ports with its ``zoo.cfg``, data and log in a private temporary directory, on the shared lifecycle of
``_base``. Tuned for tests: a 64 MB heap, a 100 ms tick (sessions as short as 0.4 s, quick elections), no fsync (a
killed server keeps what it wrote; tokens survive ``kill()`` and ``start()``). Readiness and mode (standalone,
leader, follower) come from the four-letter word ``srvr``. The jar is ``$DISTLOCK_ZOOKEEPER_JAR``, else Debian's
``/usr/share/java/zookeeper.jar``; Java is ``$DISTLOCK_JAVA_BIN``, else ``java`` on ``$PATH``.

What can go wrong:

- No jar or no Java: `ConfigurationError`, naming the Debian package ``zookeeper``.
- A server that exits or does not serve within ``start_timeout``: `ServerStartError` with the tail of its log
  (Java's own output only: Debian's jar has no SLF4J binding).
- An ensemble needs a majority: with two of three members down, the third serves nothing until one is back.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from distlock._errors import ConfigurationError
from distlock.testing._base import (
    _HOST,
    _PORT_ATTEMPTS,
    HarnessError,
    ServerStartError,
    _explicit_binary,
    _free_port,
    _Managed,
    _PortInUse,
    _Server,
)

__all__ = ["ZooKeeperEnsemble", "ZooKeeperServer", "find_zookeeper"]

_HINT = "install the Debian/Ubuntu package zookeeper (apt-get install zookeeper), or run scripts/servers.sh"
_DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
_TICK_MS = 100


def find_zookeeper() -> tuple[str, str]:
    """``(java, jar)``: ``$DISTLOCK_JAVA_BIN`` or ``java`` on ``$PATH``, and ``$DISTLOCK_ZOOKEEPER_JAR`` or
    Debian's ``/usr/share/java/zookeeper.jar``."""
    jar = os.environ.get("DISTLOCK_ZOOKEEPER_JAR") or _DEBIAN_JAR
    if not Path(jar).is_file():
        raise ConfigurationError(f"no ZooKeeper jar at {jar} ($DISTLOCK_ZOOKEEPER_JAR or Debian's): {_HINT}")
    java = _explicit_binary("DISTLOCK_JAVA_BIN") or shutil.which("java")
    if java is None:
        raise ConfigurationError(f"no java found (looked at $DISTLOCK_JAVA_BIN and $PATH): {_HINT}")
    return java, jar


def _four_letter_word(port: int, word: bytes, timeout: float = 1.0) -> str:
    try:
        with socket.create_connection((_HOST, port), timeout=timeout) as connection:
            connection.sendall(word)
            reply = b""
            while chunk := connection.recv(4096):
                reply += chunk
    except OSError:
        return ""
    return reply.decode("utf-8", "replace")


class ZooKeeperServer(_Server):
    """One ZooKeeper server on 127.0.0.1 in its own temporary directory: standalone, or a member of a
    `ZooKeeperEnsemble` (which creates its members)."""

    _log_name = "zookeeper.log"

    def __init__(self, *, start_timeout: float = 30.0, extra_args: Sequence[str] = (), port: int | None = None) -> None:
        self._java, self._jar = find_zookeeper()
        self._extra_args = list(extra_args)
        self._client_port: int | None = None
        self._peers: list[tuple[int, int]] = []  # (quorum port, election port) of every member, ensemble only
        self._member_id = 0
        super().__init__("distlock-zk-", start_timeout, port)

    @property
    def _label(self) -> str:
        return f"ZooKeeper {self._member_id}" if self._peers else "ZooKeeper"

    @property
    def port(self) -> int:
        if self._client_port is None:
            raise HarnessError(f"{self._label} has no port until it is started")
        return self._client_port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``."""
        return f"{_HOST}:{self.port}"

    @property
    def url(self) -> str:
        """``zk://127.0.0.1:<port>``."""
        return f"zk://{self.endpoint}"

    def mode(self, timeout: float = 1.0) -> str:
        """What the server says it is: "standalone", "leader", "follower", or "" when it does not serve."""
        if not self.running or self.paused or self._client_port is None:
            return ""
        for line in _four_letter_word(self._client_port, b"srvr", timeout).splitlines():
            if line.startswith("Mode:"):
                return line.partition(":")[2].strip()
        return ""

    def packets_received(self) -> int:
        """Packets the server received from clients since it started (``mntr``'s ``zk_packets_received``: every
        request, and every session's pings)."""
        self._require_running()
        for line in _four_letter_word(self.port, b"mntr", 5.0).splitlines():
            key, _, value = line.partition("\t")
            if key == "zk_packets_received":
                return int(value)
        raise HarnessError(f"{self._label} did not answer mntr")

    def _where(self) -> str:
        return f"{_HOST}:{self._client_port}" if self._client_port is not None else "no port yet"

    def _choose_ports(self) -> None:
        self._client_port = self._client_port_choice()

    def _configure_member(self, member_id: int, client_port: int, peers: list[tuple[int, int]]) -> None:
        self._member_id = member_id
        self._client_port = client_port
        self._peers = peers
        self._ports_fixed = True

    def _prepare(self) -> None:
        self.data_dir.mkdir()

    def _command(self) -> list[str]:
        config = [
            f"tickTime={_TICK_MS}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={_HOST}",
            f"minSessionTimeout={4 * _TICK_MS}",
            "maxSessionTimeout=120000",
            "initLimit=50",
            "syncLimit=10",
            "4lw.commands.whitelist=srvr,ruok,stat,mntr",
            "admin.enableServer=false",
        ]
        if self._peers:
            config += [
                f"server.{i + 1}={_HOST}:{quorum}:{election}" for i, (quorum, election) in enumerate(self._peers)
            ]
            (self.data_dir / "myid").write_text(f"{self._member_id}\n")
        path = self.base_dir / "zoo.cfg"
        path.write_text("\n".join(config) + "\n")
        return [
            self._java,
            "-Xms16m",
            "-Xmx64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.forceSync=no",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            self._jar,
            *self._extra_args,
            _MAIN,
            str(path),
        ]

    def _ready(self) -> bool:
        return self.mode() != ""


class ZooKeeperEnsemble(_Managed):
    """``size`` ZooKeeper servers on loopback forming one ensemble (a quorum of ``size // 2 + 1``).

    ``members[i]`` is a `ZooKeeperServer`: kill, stop, pause, resume and restart them one by one; ``restore()``
    brings back every member a test took down; ``leader_index()`` says which one leads.
    """

    def __init__(self, size: int = 3, *, start_timeout: float = 60.0) -> None:
        if size < 1:
            raise ConfigurationError(f"a ZooKeeper ensemble needs at least one member, not {size}")
        self._start_timeout = start_timeout
        self.members: list[ZooKeeperServer] = []
        try:
            for _ in range(size):
                self.members.append(ZooKeeperServer(start_timeout=start_timeout))
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start all members at once and wait until each serves (which needs a leader)."""
        for attempt in range(_PORT_ATTEMPTS):
            peers = [(_free_port(), _free_port()) for _ in self.members]
            for index, member in enumerate(self.members):
                member._configure_member(index + 1, _free_port(), peers)
            try:
                self._launch_and_wait(self.members)
            except _PortInUse:
                for member in self.members:
                    member.kill()
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                for member in self.members:
                    member.kill()
                raise
            else:
                return

    def restore(self) -> None:
        """Resume paused members, restart stopped or killed ones, wait until all serve."""
        down = []
        for member in self.members:
            if member.paused:
                member.resume()
            elif not member.running:
                down.append(member)
        self._launch_and_wait(down)

    def close(self) -> None:
        """Stop all members and remove their directories. Safe to call twice."""
        for member in self.members:
            member.kill()
        for member in self.members:
            member.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.members!r}>"

    @property
    def url(self) -> str:
        """``zk://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        return "zk://" + ",".join(member.endpoint for member in self.members)

    def leader_index(self) -> int:
        """Index in ``members`` of the leader; `HarnessError` while there is no single one."""
        leaders = [index for index, member in enumerate(self.members) if member.mode() == "leader"]
        if len(leaders) != 1:
            raise HarnessError(f"no single leader among the live members: {leaders or 'none'} say they lead")
        return leaders[0]

    def wait_for_leader(self, timeout: float = 30.0) -> int:
        """Wait until the live members have one leader; return its index."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader_index()
            except HarnessError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def _launch_and_wait(self, members: Sequence[ZooKeeperServer]) -> None:
        for member in members:
            if not member._prepared:
                member._prepare()
                member._prepared = True
            member._launch()
        deadline = time.monotonic() + self._start_timeout
        waiting = list(members)
        while waiting:
            waiting = [member for member in waiting if not member._poll_ready()]
            if waiting and time.monotonic() > deadline:
                logs = "\n".join(f"--- {m._label} ({m.log_path}):\n{m.log_tail(1500)}" for m in waiting)
                raise ServerStartError(f"ZooKeeper members were not serving within {self._start_timeout:g} s.\n{logs}")
            if waiting:
                time.sleep(0.05)
