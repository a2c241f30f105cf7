"""What the ZooKeeper backend promises beyond the backend-neutral contract (which runs on ZooKeeper too, with
``test_sigkilled_holder_frees_the_lock_within_ttl``: a killed holder's session frees the lock within its timeout
+ 1 s): tokens (creation zxids) keep increasing across a server kill and restart and a leader's death, no two
holders at once while the ensemble fails over, and the URL's chroot keeps two applications apart."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from _support import wait_until

import distlock
from distlock.testing import ZooKeeperEnsemble, ZooKeeperServer


@pytest.fixture(scope="module")
def zookeeper_ensemble() -> Iterator[ZooKeeperEnsemble]:
    with ZooKeeperEnsemble(3) as ensemble:
        yield ensemble


@pytest.fixture
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    with ZooKeeperServer() as server:
        yield server


def test_tokens_increase_across_a_server_kill_and_restart(zookeeper_server: ZooKeeperServer, lock_name: str) -> None:
    with distlock.connect(zookeeper_server.url) as client, client.lock(lock_name, ttl=10) as lock:
        before = lock.token
    zookeeper_server.kill()
    zookeeper_server.start()
    with distlock.connect(zookeeper_server.url) as client, client.lock(lock_name, ttl=10) as lock:
        assert lock.token > before


def test_the_url_chroot_keeps_two_applications_apart(zookeeper_url: str, lock_name: str) -> None:
    with (
        distlock.connect(f"{zookeeper_url}/app-a") as first,
        distlock.connect(f"{zookeeper_url}/app-b") as second,
        first.lock(lock_name, ttl=10),
    ):
        other = second.lock(lock_name, ttl=10)
        assert other.acquire(blocking=False), "a lock of another chroot held ours"
        assert [state.name for state in first.inspect()] == [lock_name]
        other.release()


def test_a_leader_kill_never_makes_two_holders_and_waiters_proceed(
    zookeeper_ensemble: ZooKeeperEnsemble, lock_name: str
) -> None:
    zookeeper_ensemble.restore()
    holding: list[int] = []  # tokens of the holders inside the critical section now
    tokens: list[int] = []
    overlaps: list[tuple[int, ...]] = []
    mutex = threading.Lock()
    stop = threading.Event()
    after_kill: list[int] = []
    killed = threading.Event()

    def contend() -> None:
        # fail_fast=0: it tries again at once after an error; a client failing fast would make it spin.
        with distlock.connect(zookeeper_ensemble.url, request_timeout=20, fail_fast=0) as client:
            while not stop.is_set():
                lock = client.lock(lock_name, ttl=4, timeout=30)
                try:
                    if not lock.acquire():
                        continue
                except distlock.BackendUnavailable:
                    continue
                try:
                    with mutex:
                        if holding:
                            overlaps.append((*holding, lock.token))
                        holding.append(lock.token)
                        tokens.append(lock.token)
                        if killed.is_set():
                            after_kill.append(lock.token)
                    time.sleep(0.01)  # a short critical section, so that holders overlap if the lock lets them
                    with mutex:
                        holding.remove(lock.token)
                finally:
                    with contextlib.suppress(distlock.DistlockError):
                        lock.release()  # may be lost during the failover: the next holder has a larger token

    threads = [threading.Thread(target=contend) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(tokens) >= 10, 30, "ten acquisitions before the kill")
        leader = zookeeper_ensemble.leader_index()
        zookeeper_ensemble.members[leader].kill()
        killed.set()
        wait_until(lambda: len(after_kill) >= 10, 60, "ten acquisitions after the leader's death")
        zookeeper_ensemble.wait_for_leader()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        zookeeper_ensemble.restore()
    assert not overlaps, f"two holders at once: {overlaps}"
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), "tokens did not keep increasing"
    assert after_kill[0] > max(t for t in tokens if t not in after_kill)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("zk://user:secret@127.0.0.1:2181", "authentication is not supported"),
        ("zk://127.0.0.1:2181/app/../other", r"'\.' or '\.\.' component"),
        ("zk://127.0.0.1:2181?ca=/ca.pem", "unknown option 'ca'"),
        ("zk://", "names no host"),
    ],
)
def test_a_bad_zookeeper_url_is_refused_before_any_traffic(url: str, message: str) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        distlock.connect(url, check=False)


class _SilentAfterCut:
    """A TCP relay to one ZooKeeper server that can act as a server starting up: ``cut()`` breaks every relayed
    connection, and the connections accepted in the next ``silent_for`` s are left open and unanswered (ZooKeeper's
    socket listens before the server runs, ZOOKEEPER-3916); later ones are relayed again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._silent_until = 0.0
        self._mutex = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, silent_for: float) -> None:
        with self._mutex:
            self._silent_until = time.monotonic() + silent_for
            dropped, self._open = self._open, []
        for connection in dropped:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut(0)
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                incoming, _ = self._listener.accept()
            except OSError:
                return
            with self._mutex:
                self._open.append(incoming)
                if time.monotonic() < self._silent_until:
                    continue  # accepted, never answered
                outgoing = socket.create_connection(self._target)
                self._open.append(outgoing)
            for source, sink in ((incoming, outgoing), (outgoing, incoming)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay(zookeeper_url: str) -> Iterator[_SilentAfterCut]:
    host, _, port = zookeeper_url.removeprefix("zk://").partition(":")
    relay = _SilentAfterCut((host, int(port)))
    yield relay
    relay.close()


def test_a_reconnection_the_server_never_answers_is_dropped_and_made_again(
    relay: _SilentAfterCut, lock_name: str
) -> None:
    """A server that accepts a connection while it starts and never answers it: kazoo alone would wait for the answer
    for the whole session timeout (here 20 s, past the requests' 5 s and the lease's life on the server). The
    reconnection is dropped after ``connect_timeout`` and made again, so the holder's session comes back and is
    still the lease's: its place reads and its release answer, and it is not lost."""
    with distlock.connect(f"zk://127.0.0.1:{relay.port}", connect_timeout=1) as client:
        holder = client.lock(lock_name, ttl=20)
        assert holder.acquire()
        relay.cut(silent_for=1.5)
        holder.ensure_held(verify=True)  # read on the lease's own session, once it is back
        assert not holder.lost
        holder.release()


def test_a_session_being_reconnected_is_not_a_lost_lease(relay: _SilentAfterCut, lock_name: str) -> None:
    """Keep-alives fall inside the 3 s the session takes to connect again (a 6 s lease is refreshed every 2 s): the
    session is away, not gone (the server keeps it for its 6 s), so the lock is held throughout."""
    with distlock.connect(f"zk://127.0.0.1:{relay.port}", connect_timeout=1) as client:
        holder = client.lock(lock_name, ttl=6)
        assert holder.acquire()
        relay.cut(silent_for=2.5)
        time.sleep(4)  # the session is back after 2.5 to 3.5 s: wait past the window, no sooner
        assert not holder.lost, "a keep-alive while the session reconnected took the lease for gone"
        holder.ensure_held(verify=True)
        holder.release()
