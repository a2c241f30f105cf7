"""The nemesis: faults on the lock service (a 3-member etcd cluster, or one Redis server) and on the lock-holding
worker processes, each undone after.

A fault runs for ``duration`` seconds and is recorded as a `Window` (name, start and end on CLOCK_MONOTONIC) for the
checker's per-fault availability. The etcd faults (`FAULTS`):

- ``leader-kill`` / ``follower-kill``: SIGKILL a member, restart it after the duration (same ports and data).
- ``leader-pause`` / ``follower-pause``: SIGSTOP a member for the duration, then SIGCONT.
- ``holder-pause``: SIGUSR1 asks a worker to SIGSTOP itself between its read and its write, lock held (see
  ``_workload``); once the kernel shows it stopped it stays so for the duration (longer than the TTL: its lease
  lapses and another worker takes the lock), then SIGCONT: it resumes with a stale token and tries its write,
  at the moment the newest holder is stopped between its own read and write (the same way).
- ``client-partition``: worker 0 cut off from every etcd member (not from the database) while it holds the lock.
- ``member-partition``: one follower cut off from the other two members (its clients still reach it).
- ``compaction-storm``: compact etcd to its current revision every few milliseconds (watches see compacted
  revisions).
- ``cluster-restart``: SIGKILL every member, then start them all again.

The Redis faults (`REDIS_FAULTS`), on a server run without an append-only file:

- ``redis-restart``: a worker stops between read and write, lock held (as in ``holder-pause``); the server is
  SIGKILLed and started again at once and comes back empty, every lock, queue, lease and token counter forgotten
  (the weaker guarantee docs/GUARANTEES.md describes); another worker gets the lock, and the stopped one resumes,
  usually well inside its TTL, with a stale token. Tokens keep increasing only because the backend floors them
  with the server's clock.
- ``redis-pause``: SIGSTOP the server for the duration, then SIGCONT: the leases run out on its wall clock meanwhile.
- ``holder-pause``: as on etcd.

Partitions use nftables (as root; Debian's ``nftables`` package) on loopback, no namespaces and no new addresses:
every process is told apart by its group id, which is all ``meta skgid`` can see of a packet's sender. Worker 0
runs with group `CLIENT_GID` (the runner starts it so), and each etcd member with group ``MEMBER_GID + index``:
the cluster is started through a small wrapper (`member_gid_wrapper`) that ``setpriv``s the group before exec'ing
etcd (same pid, so kill and pause still work). A rule marks the connections a cut-off process sends on (conntrack
mark) and drops every packet of a marked connection in both directions, and new connections to a cut-off member's
peer port. Everything lives in one table of our own, deleted when the fault ends.

What can go wrong: a fault that fails half-way is still undone (``finally``: the nft table deleted, SIGCONT sent,
members or the Redis server restored), and the runner calls `Nemesis.undo` once more before it closes the servers.
Partitions need root, ``nft`` and ``setpriv``: without them `Nemesis.check` names what is missing. A worker whose
lease the nemesis waited for but never saw held (``client-partition``) is cut off anyway, and the window's note says
so. A Redis fault's note counts the keys before the kill and just after the restart (workers may already have
queued again by then).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import distlock
from distlock.testing import EtcdCluster, EtcdServer, HarnessError, RedisServer, find_etcd

__all__ = ["CLIENT_GID", "FAULTS", "MEMBER_GID", "REDIS_FAULTS", "Nemesis", "Window", "member_gid_wrapper"]

CLIENT_GID = 64990
MEMBER_GID = 64980
TABLE = "distlock_faults"
COMPACT_EVERY = 0.005


@dataclass(frozen=True)
class Window:
    """One fault, as it happened."""

    fault: str
    start: float
    end: float
    note: str = ""


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@contextlib.contextmanager
def member_gid_wrapper(etcd_bin: str | None = None) -> Iterator[None]:
    """Within it, `EtcdCluster` members created and (re)started run etcd with group ``MEMBER_GID + index``."""
    real = etcd_bin or find_etcd()
    directory = Path(tempfile.mkdtemp(prefix="distlock-faults-"))
    wrapper = directory / "etcd"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# etcd with a group id of its own per member: nftables tells the members' packets apart by it\n"
        f"gid={MEMBER_GID}\n"
        'for arg; do case "$arg" in --name=distlock-m*)'
        f" gid=$(({MEMBER_GID} + ${{arg#--name=distlock-m}}));; esac; done\n"
        f'exec setpriv --regid="$gid" --clear-groups -- {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    before = os.environ.get("DISTLOCK_ETCD_BIN")
    os.environ["DISTLOCK_ETCD_BIN"] = str(wrapper)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISTLOCK_ETCD_BIN", None)
        else:
            os.environ["DISTLOCK_ETCD_BIN"] = before
        shutil.rmtree(directory, ignore_errors=True)


def _port(url_or_endpoint: str) -> int:
    return int(url_or_endpoint.rsplit(":", 1)[1])


class _Firewall:
    """One nftables table of ours on the output hook (loopback traffic passes it once per packet)."""

    def __init__(self) -> None:
        self.active = False

    def apply(self, rules: Sequence[str]) -> None:
        body = "\n".join(f"    {rule}" for rule in rules)
        chain = f"  chain out {{\n    type filter hook output priority 0; policy accept;\n{body}\n  }}\n"
        script = f"table inet {TABLE} {{\n{chain}}}\n"
        self.undo()
        self.active = True
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True, capture_output=True)

    def undo(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], check=False, capture_output=True)
        self.active = False


def _cut_off(gid: int, ports: Sequence[int], listen: int | None, mark: int) -> list[str]:
    """Rules cutting the process of group ``gid`` off from ``ports`` (and everyone off from its port ``listen``)."""
    targets = ", ".join(str(p) for p in ports)
    rules = [f"meta skgid {gid} tcp dport {{ {targets} }} ct mark set {mark:#x}"]
    if listen is not None:
        rules += [f"meta skgid {gid} tcp sport {listen} ct mark set {mark:#x}", f"tcp dport {listen} drop"]
    return [*rules, f"ct mark {mark:#x} drop"]


class Nemesis:
    """Faults on ``service`` and on the worker processes ``workers`` (pids; worker 0 runs with `CLIENT_GID`)."""

    def __init__(self, service: EtcdCluster | RedisServer, workers: Sequence[int], lock_name: str) -> None:
        self.service = service
        self.workers = list(workers)
        self.lock_name = lock_name
        self.windows: list[Window] = []
        self._firewall = _Firewall()
        self._stopped: set[int] = set()

    @staticmethod
    def check(faults: Sequence[str]) -> None:
        """Raise `HarnessError` if a partition fault is asked for and cannot be done here."""
        if not any(fault.endswith("partition") for fault in faults):
            return
        missing = [tool for tool in ("nft", "setpriv") if shutil.which(tool) is None]
        if os.geteuid() != 0 or missing:
            raise HarnessError(f"partition faults need root and nft/setpriv (missing: {missing or 'root'})")

    def run(self, fault: str, duration: float) -> Window:
        """Do ``fault`` for ``duration`` s; undo it (also on error); record and return its window."""
        start = _now()
        note = ""
        try:
            note = {**FAULTS, **REDIS_FAULTS}[fault](self, duration) or ""
        finally:
            self.undo()
        window = Window(fault, start, _now(), note)
        self.windows.append(window)
        return window

    def undo(self) -> None:
        """Undo whatever a fault left: drop our nft table, SIGCONT workers, bring every member (or Redis) back."""
        if self._firewall.active:
            self._firewall.undo()
        for pid in sorted(self._stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
                os.kill(pid, signal.SIGCONT)
        self._stopped.clear()
        if isinstance(self.service, RedisServer):
            if self.service.paused:
                self.service.resume()
            elif not self.service.running:
                self.service.start()
        elif any(m.paused or not m.running for m in self.service.members):
            self.service.restore()

    @property
    def cluster(self) -> EtcdCluster:
        if not isinstance(self.service, EtcdCluster):
            raise HarnessError(f"an etcd fault on {self.service!r}")
        return self.service

    @property
    def redis(self) -> RedisServer:
        if not isinstance(self.service, RedisServer):
            raise HarnessError(f"a Redis fault on {self.service!r}")
        return self.service

    # -- the faults --------------------------------------------------------------------------------------------

    def _follower(self) -> EtcdServer:
        leader = self.cluster.wait_for_leader()
        return self.cluster.members[(leader + 1) % len(self.cluster.members)]

    @staticmethod
    def _take_down(member: EtcdServer, duration: float, *, kill: bool) -> str:
        """SIGKILL (then restart) or SIGSTOP (then SIGCONT) ``member`` for ``duration`` s."""
        if kill:
            member.kill()
            time.sleep(duration)
            member.start()
        else:
            member.pause()
            time.sleep(duration)
            member.resume()
        return member.name

    def leader_kill(self, duration: float) -> str:
        return self._take_down(self.cluster.leader, duration, kill=True)

    def follower_kill(self, duration: float) -> str:
        return self._take_down(self._follower(), duration, kill=True)

    def leader_pause(self, duration: float) -> str:
        return self._take_down(self.cluster.leader, duration, kill=False)

    def follower_pause(self, duration: float) -> str:
        return self._take_down(self._follower(), duration, kill=False)

    def holder_pause(self, duration: float) -> str:
        """A worker stops itself between read and write (lock held) for ``duration``; it resumes at the worst time."""
        return self._stale_write(hold=duration, timeout=duration)

    def _stale_write(self, hold: float, timeout: float, during: Callable[[], str] | None = None) -> str:
        """Stop a worker between its read and write, lock held, for ``hold`` s at least (``during`` runs then), and
        continue it at the worst time.

        The other workers are asked at once to stop at their pause point too: the first to get the lock after the
        stale holder lost it stops after its read (``timeout`` s at most are waited for that), so the stale holder
        writes while a newer holder is between its read and its write, and nobody wrote in between (the
        interleaving a write-only fence lets through).
        """
        stale = self.workers[len(self.windows) % len(self.workers)]
        self._ask_pause([stale])
        if self._first_stopped([stale], 30.0) is None:
            raise HarnessError(f"worker pid {stale} did not reach its pause point within 30 s")
        frozen_at = _now()
        others = [pid for pid in self.workers if pid != stale]
        self._ask_pause(others)
        done = during() + "; " if during else ""
        # None when the stale holder keeps the database's row lock (a claim in its open transaction): nobody reads.
        newer = self._first_stopped(others, timeout)
        time.sleep(max(0.0, hold - (_now() - frozen_at)))
        os.kill(stale, signal.SIGCONT)
        stopped = _now() - frozen_at
        time.sleep(0.2)  # the stale holder's write: a few statements
        self._cancel_pauses(others)
        self._stopped.clear()
        there = f"while pid {newer} was there too" if newer else "alone (nobody else reached a read)"
        return f"{done}worker pid {stale} stopped {stopped:.2f} s between read and write; resumed {there}"

    def _ask_pause(self, pids: Sequence[int]) -> None:
        """Ask ``pids`` to stop at their pause point (SIGUSR1)."""
        self._stopped.update(pids)
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)

    def _first_stopped(self, pids: Sequence[int], timeout: float) -> int | None:
        """The first of ``pids`` seen stopped, None after ``timeout``."""
        deadline = _now() + timeout
        while _now() < deadline:
            stopped = [pid for pid in pids if _state(pid) in ("T", "t")]
            if stopped:
                return stopped[0]
            time.sleep(0.002)
        return None

    def _cancel_pauses(self, pids: Sequence[int]) -> None:
        """Withdraw the pause requests (SIGUSR2) and continue whoever stopped, also just after the withdrawal."""
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
        deadline = _now() + 0.5
        while _now() < deadline:
            for pid in pids:
                if _state(pid) in ("T", "t"):
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.01)

    def client_partition(self, duration: float) -> str:
        """Cut worker 0 off from etcd, at a moment it holds the lock if that shows within 10 s."""
        ports = [_port(endpoint) for endpoint in self.cluster.endpoints]
        held = _wait_for_holder(self.cluster.url, self.lock_name, "w0", 10.0)
        self._firewall.apply(_cut_off(CLIENT_GID, ports, None, 0xC1))
        time.sleep(duration)
        self._firewall.undo()
        return "worker 0 cut off while holding" if held else "worker 0 cut off (not seen holding)"

    def member_partition(self, duration: float) -> str:
        """Cut one follower off from the other two members: no raft traffic either way."""
        follower = self._follower()
        index = self.cluster.members.index(follower)
        peers = [_port(m.peer_url) for m in self.cluster.members if m is not follower]
        self._firewall.apply(_cut_off(MEMBER_GID + index, peers, _port(follower.peer_url), 0xC2))
        time.sleep(duration)
        self._firewall.undo()
        return follower.name

    def compaction_storm(self, duration: float) -> str:
        compactions = 0
        end = _now() + duration
        while _now() < end:
            member = self.cluster.members[compactions % len(self.cluster.members)]
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError, KeyError):
                header = _gateway(member, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})["header"]
                _gateway(member, "/v3/kv/compaction", {"revision": header["revision"]})
                compactions += 1
            time.sleep(COMPACT_EVERY)
        return f"{compactions} compactions"

    def cluster_restart(self, duration: float) -> str:
        for member in self.cluster.members:
            member.kill()
        time.sleep(duration)
        self.cluster.restore()
        return "all members"

    def redis_restart(self, duration: float) -> str:
        """SIGKILL Redis while a worker holds the lock between its read and write, and start it again at once.

        It comes back empty, so another worker gets the lock although the first one's lease had time left; the first
        is continued as soon as that newer holder is at its own pause point (within ``duration``), usually well
        inside its TTL: a lease that etcd would still honour, and a stale write only the fence refuses.
        """

        def restart() -> str:
            with self.redis.client(timeout=1.0) as client:
                keys = client.dbsize()
            self.redis.kill()
            self.redis.start()
            with self.redis.client(timeout=1.0) as client:
                return f"SIGKILL with {keys} keys, restarted with {client.dbsize()}"

        return self._stale_write(hold=0.0, timeout=duration, during=restart)

    def redis_pause(self, duration: float) -> str:
        self.redis.pause()
        time.sleep(duration)
        self.redis.resume()
        return "SIGSTOP, SIGCONT"


FAULTS: dict[str, Callable[[Nemesis, float], str | None]] = {
    "leader-kill": Nemesis.leader_kill,
    "follower-kill": Nemesis.follower_kill,
    "leader-pause": Nemesis.leader_pause,
    "follower-pause": Nemesis.follower_pause,
    "holder-pause": Nemesis.holder_pause,
    "client-partition": Nemesis.client_partition,
    "member-partition": Nemesis.member_partition,
    "compaction-storm": Nemesis.compaction_storm,
    "cluster-restart": Nemesis.cluster_restart,
}

REDIS_FAULTS: dict[str, Callable[[Nemesis, float], str | None]] = {
    "redis-restart": Nemesis.redis_restart,
    "redis-pause": Nemesis.redis_pause,
    "holder-pause": Nemesis.holder_pause,
}


def _state(pid: int) -> str:
    """The process state letter of ``pid`` from /proc (``T`` stopped, ``Z`` zombie), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _gateway(member: EtcdServer, path: str, body: dict[str, object]) -> Any:
    """POST to etcd's JSON gateway on ``member``; the decoded answer."""
    connection = http.client.HTTPConnection("127.0.0.1", _port(member.endpoint), timeout=1.0)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def _wait_for_holder(url: str, name: str, owner: str, timeout: float) -> bool:
    """Whether ``owner`` was seen holding ``name`` within ``timeout`` s (polled every few ms)."""
    with distlock.connect(url) as client:
        deadline = _now() + timeout
        while _now() < deadline:
            holder = client.holder(name)
            if holder is not None and holder.owner == owner:
                return True
            time.sleep(0.003)
    return False
