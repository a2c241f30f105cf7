"""ZooKeeper keeps nothing for a lock name once every holder and waiter of it is gone (docs/operations/zookeeper.md,
"What stays behind"): a release, a give-up or a revoke removes the lock's node with its last entry; a session the
server expires leaves a CONTAINER node that the server reclaims on its container check; an election's record lives
on. Token order survives the lock's node being made afresh; a join racing its removal makes it again and queues
once; a client of the old layout (lock nodes made with kazoo's ``makepath``, never removed) works beside a new one.

Each test counts the znodes under its own chroot with a plain kazoo client, as an operator would; the prefix's own
node (one per prefix) may stay.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _support import Worker, wait_until
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

import distlock
from distlock.testing import ZooKeeperServer

#: What a lock node left empty by a killed holder needs: the server's container check, every 100 ms here (60 s by
#: default, ``znode.container.checkIntervalMs``).
_QUICK_CONTAINER_CHECK = "-Dznode.container.checkIntervalMs=100"


def znodes_under(zk: KazooClient, path: str) -> list[str]:
    """Every znode below ``path`` (not ``path`` itself), depth first; none when ``path`` does not exist (or stops
    existing while it is read: the server's container check may remove a node between two reads)."""
    try:
        children = zk.get_children(path)
    except NoNodeError:
        return []
    found = []
    for child in children:
        found.append(f"{path}/{child}")
        found.extend(znodes_under(zk, f"{path}/{child}"))
    return found


@pytest.fixture
def zk(zookeeper_url: str) -> Iterator[KazooClient]:
    """A plain kazoo client on the session's ZooKeeper, to look at the tree as an operator would."""
    client = KazooClient(hosts=zookeeper_url.removeprefix("zk://"))
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def chroot() -> str:
    """A chroot no other test uses: its locks live under ``/<chroot>/distlock``."""
    return f"residue-{uuid.uuid4().hex[:8]}"


def old_join(zk: KazooClient, parent: str, owner: bytes = b"old") -> tuple[str, Any]:
    """A join as distlock made it before its lock nodes were removed: kazoo's ``makepath``, which makes a missing
    lock node as a plain PERSISTENT one (after a NoNode answer, so racing a removal: it makes it again)."""
    path, stat = zk.create(
        f"{parent}/{uuid.uuid4().hex}-", owner, ephemeral=True, sequence=True, makepath=True, include_data=True
    )
    return str(path), stat


def test_names_taken_and_released_leave_nothing(zookeeper_url: str, zk: KazooClient, chroot: str) -> None:
    root = f"/{chroot}/distlock"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        for number in range(300):
            with client.lock(f"order:{number}", ttl=10):
                pass
        with client.semaphore("pool", 2, ttl=10), client.semaphore("pool", 2, ttl=10):
            third = client.semaphore("pool", 2, ttl=10)
            assert not third.acquire(blocking=False)  # a join given up: its entry leaves
        rwlock = client.rwlock("document", ttl=10)
        with rwlock.read(), rwlock.read():
            assert not rwlock.write().acquire(blocking=False)
        with rwlock.write():
            pass
        holder = client.lock("contended", ttl=10)
        assert holder.acquire()
        waiter = client.lock("contended", ttl=10)
        thread = threading.Thread(target=waiter.acquire)
        thread.start()
        wait_until(lambda: len(zk.get_children(f"{root}/contended")) == 2, 10, "the waiter to queue")
        holder.release()
        thread.join(10)
        assert waiter.owned()
        waiter.release()
        assert znodes_under(zk, root) == []
    assert zk.exists(root), "the prefix's own node stays (one per prefix)"


def test_a_killed_holders_lock_node_is_reclaimed_by_the_servers_container_check(chroot: str) -> None:
    with ZooKeeperServer(extra_args=[_QUICK_CONTAINER_CHECK]) as server:
        url, root = f"{server.url}/{chroot}", f"/{chroot}/distlock"
        workers = [Worker(url), Worker(url)]
        zk = KazooClient(hosts=server.endpoint)
        zk.start(timeout=30)
        try:
            assert workers[0].call(op="acquire", name="order:1", ttl=2)["acquired"]
            assert workers[1].call(op="acquire", name="pool", ttl=2, limit=3)["acquired"]
            assert len(znodes_under(zk, root)) == 4
            for worker in workers:
                worker.kill()
            # The session expires after its 2 s timeout; the container check then removes the empty lock nodes.
            wait_until(lambda: znodes_under(zk, root) == [], 30, "the killed holders' lock nodes to go")
        finally:
            for worker in workers:
                worker.close()
            zk.stop()
            zk.close()


def test_a_session_closed_from_outside_leaves_nothing(
    zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str
) -> None:
    # The shared server checks its containers only every 60 s: what goes here is removed by the client whose
    # session was closed, when its keeper revokes the lost lease.
    root = f"/{chroot}/distlock"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        lock = client.lock(lock_name, ttl=10)
        assert lock.acquire()
        held = client.holder(lock_name)
        assert held is not None
        sessions: Any = client._backend._sessions  # type: ignore[attr-defined]
        session_id, password = sessions.of_lease(held.lease_id).client_id
        outsider = KazooClient(hosts=zookeeper_url.removeprefix("zk://"), client_id=(session_id, password))
        outsider.start(timeout=30)
        outsider.stop()  # closes that session: its nodes go, and the client's lease is lost
        outsider.close()
        wait_until(lambda: lock.lost, 30, "the client to see its lease lost")
        wait_until(lambda: znodes_under(zk, root) == [], 30, "the lost lock's node to go")


def test_a_force_release_leaves_nothing(zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str) -> None:
    url = f"{zookeeper_url}/{chroot}"
    with distlock.connect(url) as holder_client, distlock.connect(url) as operator:
        lock = holder_client.lock(lock_name, ttl=10)
        assert lock.acquire()
        assert operator.force_release(lock_name, lock.token)
        assert znodes_under(zk, f"/{chroot}/distlock") == []


def test_a_join_racing_the_lock_nodes_removal_makes_it_again_and_queues_once(
    zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str
) -> None:
    url, parent = f"{zookeeper_url}/{chroot}", f"/{chroot}/distlock/{lock_name.replace('/', '%2F')}"
    with distlock.connect(url) as first, distlock.connect(url) as second:
        holder = first.lock(lock_name, ttl=10)
        assert holder.acquire()
        holders_token = holder.token
        sessions: Any = second._backend._sessions  # type: ignore[attr-defined]
        make_lock_node = sessions.make_lock_node
        made: list[str] = []

        def release_between_the_two_creates(client: KazooClient, path: str) -> Any:
            # The join sends "make the lock node" and "make my node" in one flight: here the first is answered
            # (it exists: the holder's node is in it), then the holder's release removes the lock node, and only
            # then the join's own create goes out, to find no lock node.
            answer = make_lock_node(client, path)
            answer.wait(10)
            made.append("made" if answer.successful() else type(answer.exception).__name__)
            if len(made) == 1:
                holder.release()
                assert not zk.exists(parent), "the holder's release left the lock node"
            return answer

        sessions.make_lock_node = release_between_the_two_creates
        joiner = second.lock(lock_name, ttl=10)
        assert joiner.acquire(timeout=10)
        assert made == ["NodeExistsError", "made"], "the join did not make the lock node again"
        assert len(zk.get_children(parent)) == 1, "the join queued twice"
        assert joiner.token > holders_token
        joiner.release()
    assert znodes_under(zk, f"/{chroot}") == [f"/{chroot}/distlock"]


def test_token_order_survives_the_lock_nodes_removal(
    zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str
) -> None:
    parent = f"/{chroot}/distlock/{lock_name.replace('/', '%2F')}"
    tokens, sequences = [], []
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        for _ in range(5):
            with client.lock(lock_name, ttl=10) as lock:
                tokens.append(lock.token)
                sequences.append([child.rpartition("-")[2] for child in zk.get_children(parent)])
            assert not zk.exists(parent)
    assert tokens == sorted(set(tokens)), "tokens did not keep increasing across the lock node's removal"
    # The sequence numbers start again with every new lock node: they order a queue, never tokens.
    assert sequences == [["0000000000"]] * 5


def test_no_path_names_two_sessions_entries_across_the_lock_nodes_lives(
    zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str
) -> None:
    # Every client's first join of a name uses seat 0, and the sequence starts again at 0 in each new lock node: the
    # lease in the name keeps two clients' entries apart, so a retried delete of one can never remove the other's.
    parent = f"/{chroot}/distlock/{lock_name.replace('/', '%2F')}"
    paths = []
    for _ in range(2):
        with distlock.connect(f"{zookeeper_url}/{chroot}") as client, client.lock(lock_name, ttl=10):
            paths.append(zk.get_children(parent))
        assert not zk.exists(parent)
    assert len(paths[0]) == len(paths[1]) == 1 and paths[0] != paths[1]


def test_an_elections_record_lives_on(zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str) -> None:
    parent = f"/{chroot}/distlock/{lock_name.replace('/', '%2F')}"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        with client.election(lock_name) as election:
            election.record(b"tick 1")
        # The record is the lock node's data; an empty persistent child keeps the server from reclaiming it.
        assert znodes_under(zk, parent) == [f"{parent}/record"]
        assert zk.get(parent)[0] == b"tick 1"
        with client.election(lock_name) as election:
            assert election.recorded() == b"tick 1"
            election.record(b"tick 2")
        assert znodes_under(zk, parent) == [f"{parent}/record"]
        assert client.election(lock_name).recorded() == b"tick 2"


def test_a_client_of_the_old_layout_works_beside_a_new_one(
    zookeeper_url: str, zk: KazooClient, chroot: str, lock_name: str
) -> None:
    parent = f"/{chroot}/distlock/{lock_name.replace('/', '%2F')}"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        # An old join behind a new holder: the new release finds the lock node not empty and leaves it.
        holder = client.lock(lock_name, ttl=10)
        assert holder.acquire()
        old, old_stat = old_join(zk, parent)
        new_token = holder.token
        holder.release()
        found = client.holder(lock_name)
        assert found is not None and found.token == old_stat.czxid > new_token
        zk.delete(old)  # the old release: its own node only
        assert zk.exists(parent), "an old client leaves the lock node"

        # A new join and release remove the old layout's lock node; an old join after it makes it again
        # (PERSISTENT, through makepath), a new waiter queues behind it and removes it when it is done.
        with client.lock(lock_name, ttl=10):
            pass
        assert not zk.exists(parent)
        old, old_stat = old_join(zk, parent)
        waiter = client.lock(lock_name, ttl=10)
        assert not waiter.acquire(blocking=False)
        thread = threading.Thread(target=waiter.acquire)
        thread.start()
        wait_until(lambda: len(zk.get_children(parent)) == 2, 10, "the new waiter to queue behind the old holder")
        zk.delete(old)
        thread.join(10)
        assert waiter.owned() and waiter.token > old_stat.czxid
        waiter.release()
        assert not zk.exists(parent)


def test_expired_marks_are_swept_by_a_later_write_and_live_ones_stay(
    zookeeper_url: str, zk: KazooClient, chroot: str
) -> None:
    # Marks stay after close until they expire and a later mark's write sweeps them (docs/operations/zookeeper.md,
    # "Marks"): their node beside the locks' is a CONTAINER of time buckets, each deleted once its marks expired.
    marks = f"/{chroot}/distlock/%marks"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        with client.lock("invoice", ttl=10) as lock:
            lock.write_mark("short", b"v", ttl=1)
            lock.write_mark("long", b"v", ttl=600)
            (short_bucket,) = [b for b in zk.get_children(marks) if zk.exists(f"{marks}/{b}/invoice%mshort")]
            assert len(zk.get_children(f"/{chroot}/distlock/invoice")) == 1  # the lock's node: its entry only

            def swept() -> bool:
                lock.write_mark("poke", b"v", ttl=600)
                return not zk.exists(f"{marks}/{short_bucket}")

            # The bucket's bound is at most 1 s plus two of its 1 s widths past the write: 15 s is generous.
            wait_until(swept, 15, "the expired mark's bucket to be swept", interval=0.5)
        assert client.read_mark("invoice", "short") is None
        assert client.read_mark("invoice", "long") == b"v"
    left = sorted(path.removeprefix(marks + "/") for path in znodes_under(zk, marks))
    assert [path.partition("/")[2] for path in left if "/" in path] == ["invoice%mlong", "invoice%mpoke"]
    # Nothing else stays: the lock's node went with its last entry; the live marks go when they expire.
    assert sorted(znodes_under(zk, f"/{chroot}/distlock")) == sorted([marks, *(f"{marks}/{path}" for path in left)])


def test_a_sweep_keeps_a_live_mark_that_a_slow_writer_put_in_a_bucket_past_its_bound(
    zookeeper_url: str, zk: KazooClient, chroot: str
) -> None:
    # A writer paused between reading the server's time and its multi-op may land its mark in a bucket whose bound
    # has passed: the sweep judges each mark by its own mtime and TTL, and keeps the bucket while a mark is in it.
    marks = f"/{chroot}/distlock/%marks"
    with distlock.connect(f"{zookeeper_url}/{chroot}") as client:
        with client.lock("invoice", ttl=10) as lock:
            lock.write_mark("first", b"v", ttl=600)  # makes the marks' node
            zk.create(f"{marks}/t1", b"")  # a bucket whose bound (1 ms after the epoch) has long passed
            zk.create(f"{marks}/t1/invoice%mslow", b"600000\nlate")
            lock.write_mark("next", b"v", ttl=600)  # sweeps t1
        assert client.read_mark("invoice", "slow") == b"late"
        assert zk.get_children(f"{marks}/t1") == ["invoice%mslow"]
