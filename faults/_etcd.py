"""The etcd lock service under test: `EtcdService`, a 3-member `EtcdCluster` (50 ms heartbeat, 500 ms election
timeout) of one etcd binary, and its faults:

- ``leader-kill`` / ``follower-kill``: SIGKILL a member, restart it after the duration (same ports and data).
- ``leader-pause`` / ``follower-pause``: SIGSTOP a member for the duration, then SIGCONT.
- ``client-partition``: worker 0 cut off from every etcd member (not from the database) while it holds the lock.
- ``member-partition``: one follower cut off from the other two members (its clients still reach it).
- ``compaction-storm``: compact etcd to its current revision every few milliseconds (watches see compacted
  revisions).
- ``cluster-restart``: SIGKILL every member, then start them all again.
- ``holder-pause``: as on every service (``_nemesis``).

The keys are docs/operations/etcd.md's: a join puts ``<lease hex>-<seat>``, and each worker puts the same key at
every acquisition (its lease's seat 0), so every case runs on reused keys. A join retried across a fault (a frozen or
killed leader, a partition) retires its seat: the worker's next acquisitions use the next seat, and the late-join
sweep removes a late copy of the retried join under the retired one.

Partitions use nftables (as root; Debian's ``nftables`` package) on loopback, no namespaces and no new addresses:
every process is told apart by its group id, which is all ``meta skgid`` can see of a packet's sender. Worker 0
runs with group `CLIENT_GID` (the runner starts it so), and each etcd member with group ``MEMBER_GID + index``:
the cluster is started through a small wrapper (`member_gid_wrapper`) that ``setpriv``s the group before exec'ing
etcd (same pid, so kill and pause still work). A rule marks the connections a cut-off process sends on (conntrack
mark) and drops every packet of a marked connection in both directions, and new connections to a cut-off member's
peer port. Everything lives in one table of our own, deleted when the fault is undone.

What can go wrong: partitions need root, ``nft`` and ``setpriv``: without them `EtcdService.check` names what is
missing. A worker whose lease was never seen held (``client-partition``) is cut off anyway, and the note says so.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import distlock
from distlock.testing import EtcdCluster, EtcdServer, HarnessError, find_etcd
from faults._nemesis import CLIENT_GID, HOLDER_PAUSE
from faults._service import Service, first_line

if TYPE_CHECKING:
    from faults._nemesis import Nemesis

__all__ = ["MEMBER_GID", "EtcdService", "member_gid_wrapper"]

MEMBER_GID = 64980
TABLE = "distlock_faults"
COMPACT_EVERY = 0.005


@contextlib.contextmanager
def member_gid_wrapper(etcd_bin: str) -> Iterator[None]:
    """Within it, `EtcdCluster` members created and (re)started run etcd with group ``MEMBER_GID + index``."""
    directory = Path(tempfile.mkdtemp(prefix="distlock-faults-"))
    wrapper = directory / "etcd"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# etcd with a group id of its own per member: nftables tells the members' packets apart by it\n"
        f"gid={MEMBER_GID}\n"
        'for arg; do case "$arg" in --name=distlock-m*)'
        f" gid=$(({MEMBER_GID} + ${{arg#--name=distlock-m}}));; esac; done\n"
        f'exec setpriv --regid="$gid" --clear-groups -- {etcd_bin} "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        with _env("DISTLOCK_ETCD_BIN", str(wrapper)):
            yield
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


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


class EtcdService(Service):
    """A 3-member cluster of ``etcd_bin`` (default: `find_etcd`), members run with their own group ids when a
    partition fault is planned."""

    name = "etcd"
    faults = (
        "leader-kill",
        "follower-kill",
        "leader-pause",
        "follower-pause",
        HOLDER_PAUSE,
        "client-partition",
        "member-partition",
        "compaction-storm",
        "cluster-restart",
    )
    outlast_ttl = frozenset({HOLDER_PAUSE, "client-partition"})

    def __init__(self, faults: Sequence[str] = (), etcd_bin: str | None = None) -> None:
        super().__init__(faults)
        self.etcd_bin = etcd_bin or find_etcd()
        self._stack = contextlib.ExitStack()
        self._cluster: EtcdCluster | None = None
        self._firewall = _Firewall()

    @classmethod
    def check(cls, faults: Sequence[str]) -> None:
        if not any(fault.endswith("partition") for fault in faults):
            return
        missing = [tool for tool in ("nft", "setpriv") if shutil.which(tool) is None]
        if os.geteuid() != 0 or missing:
            raise HarnessError(f"partition faults need root and nft/setpriv (missing: {missing or 'root'})")

    @property
    def cluster(self) -> EtcdCluster:
        if self._cluster is None:
            raise HarnessError("the etcd cluster is not started")
        return self._cluster

    @property
    def url(self) -> str:
        return self.cluster.url

    def start(self) -> None:
        partitions = any(fault.endswith("partition") for fault in self.planned)
        # The wrapper must outlive the cluster: restarted members exec it again.
        wrapper = member_gid_wrapper(self.etcd_bin) if partitions else _env("DISTLOCK_ETCD_BIN", self.etcd_bin)
        self._stack.enter_context(wrapper)
        cluster = EtcdCluster(3, heartbeat_interval_ms=50, election_timeout_ms=500)
        self._cluster = self._stack.enter_context(cluster)
        # ``etcd Version: 3.5.1``
        self.label = "etcd " + first_line([self.etcd_bin, "--version"]).rsplit(" ", 1)[-1]
        self.setup = f"`{self.etcd_bin}`, a 3-member cluster (50 ms heartbeat, 500 ms election timeout)"

    def close(self) -> None:
        self._stack.close()

    def undo(self) -> None:
        if self._firewall.active:
            self._firewall.undo()
        if any(m.paused or not m.running for m in self.cluster.members):
            self.cluster.restore()

    def _do(self, fault: str, duration: float, nemesis: Nemesis) -> str:
        match fault:
            case "leader-kill" | "leader-pause":
                return self._take_down(self.cluster.leader, duration, kill=fault == "leader-kill")
            case "follower-kill" | "follower-pause":
                return self._take_down(self._follower(), duration, kill=fault == "follower-kill")
            case "client-partition":
                return self._client_partition(duration, nemesis.lock_name)
            case "member-partition":
                return self._member_partition(duration)
            case "compaction-storm":
                return self._compaction_storm(duration)
            case _:
                return self._cluster_restart(duration)

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

    def _client_partition(self, duration: float, lock_name: str) -> str:
        """Cut worker 0 off from etcd, at a moment it holds the lock if that shows within 10 s."""
        ports = [_port(endpoint) for endpoint in self.cluster.endpoints]
        held = _wait_for_holder(self.cluster.url, lock_name, "w0", 10.0)
        self._firewall.apply(_cut_off(CLIENT_GID, ports, None, 0xC1))
        time.sleep(duration)
        self._firewall.undo()
        return "worker 0 cut off while holding" if held else "worker 0 cut off (not seen holding)"

    def _member_partition(self, duration: float) -> str:
        """Cut one follower off from the other two members: no raft traffic either way."""
        follower = self._follower()
        index = self.cluster.members.index(follower)
        peers = [_port(m.peer_url) for m in self.cluster.members if m is not follower]
        self._firewall.apply(_cut_off(MEMBER_GID + index, peers, _port(follower.peer_url), 0xC2))
        time.sleep(duration)
        self._firewall.undo()
        return follower.name

    def _compaction_storm(self, duration: float) -> str:
        compactions = 0
        end = time.monotonic() + duration
        while time.monotonic() < end:
            member = self.cluster.members[compactions % len(self.cluster.members)]
            with contextlib.suppress(OSError, http.client.HTTPException, ValueError, KeyError):
                header = _gateway(member, "/v3/kv/range", {"key": base64.b64encode(b"\0").decode()})["header"]
                _gateway(member, "/v3/kv/compaction", {"revision": header["revision"]})
                compactions += 1
            time.sleep(COMPACT_EVERY)
        return f"{compactions} compactions"

    def _cluster_restart(self, duration: float) -> str:
        for member in self.cluster.members:
            member.kill()
        time.sleep(duration)
        self.cluster.restore()
        return "all members"


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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            holder = client.holder(name)
            if holder is not None and holder.owner == owner:
                return True
            time.sleep(0.003)
    return False
