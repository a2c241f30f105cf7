"""Stop on loss (docs/lost.md): ``scope()`` and ``stop_on_lost=True`` stop the body when its lock is lost.

The shapes of the API run in-process on ``memory://`` (a loss is forced by ``force_release``: the keeper finds the key
gone after its next refresh, about a third of the TTL): asyncio (the task is cancelled, ``LockLost`` at the exit, an
outside cancellation stays one, ``TaskGroup``s inside), the main thread (a signal interrupts ``time.sleep()`` and a
busy loop; a foreign SIGUSR2 goes to its own handler; nested scopes), another thread (refused). The property the issue
asks for runs on etcd and Redis: a holder in another process, frozen past its TTL while a second client takes the
lock, stops its body within a bound once thawed, writes nothing after, and the next holder proceeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support import child_env

import distlock

TTL = 1.0
#: A generous bound on how long a body goes on after its lock is marked lost (measured: a few ms; see the report in
#: docs/lost.md): the signal or the cancellation is delivered at the body's next bytecode or await.
STOP_BOUND = 2.0


@pytest.fixture
def memory() -> Iterator[distlock.Client]:
    with distlock.connect(f"memory://{uuid.uuid4().hex}") as client:
        yield client


def _lose(client: distlock.Client, lock: distlock.Lock | distlock.AsyncLock) -> None:
    assert client.force_release(lock.name, lock.token)


# -- asyncio --------------------------------------------------------------------------------------------------


def test_a_lost_lock_cancels_its_async_body_with_lock_lost(memory: distlock.Client) -> None:
    async def main() -> None:
        lock = memory.async_lock("a", ttl=TTL, stop_on_lost=True)
        with pytest.raises(distlock.LockLost, match="was lost") as raised:  # noqa: PT012 - the body is what is stopped
            async with lock:
                _lose(memory, lock)
                await asyncio.sleep(30)
        assert isinstance(raised.value.__cause__, asyncio.CancelledError)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0)  # no cancellation left over for the code after the block

    asyncio.run(asyncio.wait_for(main(), 20))


def test_an_outside_cancellation_stays_a_cancelled_error(memory: distlock.Client) -> None:
    async def main() -> None:
        lock = memory.async_lock("a", ttl=TTL)
        async with lock:

            async def body() -> None:
                async with lock.scope():
                    await asyncio.sleep(30)

            task = asyncio.create_task(body())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not lock.lost

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_task_group_inside_the_scope_is_cancelled_and_the_scope_raises_lock_lost(memory: distlock.Client) -> None:
    async def main() -> None:
        cancelled: list[int] = []

        async def child(n: int) -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(n)
                raise

        lock = memory.async_lock("a", ttl=TTL)
        await lock.acquire()
        with pytest.raises(distlock.LockLost):  # noqa: PT012 - the body is what is stopped
            async with lock.scope(), asyncio.TaskGroup() as group:
                group.create_task(child(1))
                group.create_task(child(2))
                _lose(memory, lock)
        assert sorted(cancelled) == [1, 2]

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_scope_on_a_lock_lost_already_raises_at_once_and_a_loss_after_the_body_changes_nothing(
    memory: distlock.Client,
) -> None:
    async def main() -> None:
        lock = memory.async_lock("a", ttl=TTL)
        await lock.acquire()
        _lose(memory, lock)
        await asyncio.to_thread(lock.sync.lost_event.wait, 10)
        with pytest.raises(distlock.LockLost):
            async with lock.scope():
                pytest.fail("the body ran")
        other = memory.async_lock("b", ttl=TTL)
        await other.acquire()
        async with other.scope():
            pass
        _lose(memory, other)
        await asyncio.to_thread(other.sync.lost_event.wait, 10)
        await asyncio.sleep(0.1)  # not cancelled: the scope was left before the loss
        with pytest.raises(distlock.LockLost):
            await other.release()

    asyncio.run(asyncio.wait_for(main(), 20))


# -- threads --------------------------------------------------------------------------------------------------


def test_a_lost_lock_interrupts_the_main_threads_sleep(memory: distlock.Client) -> None:
    lock = memory.lock("a", ttl=TTL, stop_on_lost=True)
    started = time.monotonic()
    with pytest.raises(distlock.LockLost, match="was lost"), lock:  # noqa: PT012 - the body is what is stopped
        _lose(memory, lock)
        time.sleep(30)
    assert time.monotonic() - started < 10
    assert signal.getsignal(distlock.STOP_SIGNAL) is signal.SIG_DFL  # the previous handler is back


def test_a_lost_lock_interrupts_a_busy_loop_and_nested_scopes_unwind(memory: distlock.Client) -> None:
    outer, inner = memory.lock("a", ttl=TTL), memory.lock("b", ttl=TTL)
    steps = 0
    with outer, inner:
        with pytest.raises(distlock.LockLost, match="'a' was lost"), outer.scope(), inner.scope():  # noqa: PT012 - the body is what is stopped
            _lose(memory, outer)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                steps += 1
        assert not inner.lost
        with pytest.raises(distlock.LockLost):
            outer.release()
    assert steps > 0 and signal.getsignal(distlock.STOP_SIGNAL) is signal.SIG_DFL


def test_a_foreign_sigusr2_reaches_the_previous_handler(memory: distlock.Client) -> None:
    seen: list[int] = []

    def previous(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(distlock.STOP_SIGNAL, previous)
    try:
        with memory.lock("a", ttl=TTL, stop_on_lost=True):
            signal.raise_signal(distlock.STOP_SIGNAL)
            assert seen == [distlock.STOP_SIGNAL]
        assert signal.getsignal(distlock.STOP_SIGNAL) is previous
    finally:
        signal.signal(distlock.STOP_SIGNAL, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_a_stop_never_leaves_the_clients_own_locks_held(memory: distlock.Client) -> None:
    """The body takes and drops other locks of the same client while its own hold runs out (``max_hold``): the stop
    lands anywhere in the body, never half-way through distlock's own code, and the client goes on working (it hung
    with its internal mutex held, in a red team's run, before the stop was put off inside distlock's code)."""
    for round_ in range(20):
        with pytest.raises(distlock.LockLost):  # noqa: PT012 - the body is what is stopped
            with memory.lock("outer", ttl=3, stop_on_lost=True, max_hold=0.05 + 0.02 * (round_ % 10)):
                while True:
                    # A name per round: Python may skip a `with` block's __exit__ when an exception is raised just as
                    # the block ends (bpo-29988, as with Ctrl-C), which could leave a round's inner hold behind.
                    with memory.lock(f"inner-{round_}", ttl=3, timeout=1) as inner:
                        inner.ensure_held()
    with memory.lock("outer", ttl=3) as lock:  # the client still works: keeper, clean-up and locks
        lock.ensure_held(verify=True)
    assert sys.gettrace() is None  # and nothing is left tracing the thread's calls


def test_a_stop_swallowed_by_the_body_is_raised_again(memory: distlock.Client, tmp_path: Path) -> None:
    """A library's ``except Exception`` (logging's ``emit`` prints the error and goes on) swallows the first
    ``LockLost``; the scope stays stopped and raises it again (RESEND_EVERY) until the body leaves it."""
    swallowed: list[float] = []
    with pytest.raises(distlock.LockLost):  # noqa: PT012 - the body is what is stopped
        with memory.lock("logged", ttl=TTL, stop_on_lost=True) as lock:
            _lose(memory, lock)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    time.sleep(0.01)
                except distlock.LockLost:
                    if swallowed:
                        raise
                    swallowed.append(time.monotonic())  # the first one, as a library would
            pytest.fail("the body ran on for 30 s after its stop was swallowed once")
    assert swallowed


def test_a_sync_scope_inside_a_coroutine_is_refused(memory: distlock.Client) -> None:
    """It would stop the event loop (every task), not the coroutine: the async lock's scope is the one for that."""
    with memory.lock("in-a-loop", ttl=TTL) as lock:

        async def main() -> None:
            with pytest.raises(distlock.ConfigurationError, match=r"use client\.async_lock"):
                lock.scope().__enter__()

        asyncio.run(main())


def test_a_scope_outside_the_main_thread_is_refused_before_waiting(memory: distlock.Client) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with memory.lock("a", ttl=TTL, stop_on_lost=True):
                pass
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert isinstance(errors[0], distlock.ConfigurationError)
    assert "ensure_held()" in str(errors[0])
    assert memory.holder("a") is None


def test_stop_on_lost_must_be_a_bool(memory: distlock.Client) -> None:
    with pytest.raises(distlock.ConfigurationError, match="stop_on_lost must be True or False"):
        memory.lock("a", stop_on_lost="yes")  # type: ignore[arg-type]


# -- the test: a frozen holder in another process --------------------------------------------------------

WORKER = Path(__file__).with_name("stopworker.py")


def _run_frozen_holder(backend_url: str, client: distlock.Client, lock_name: str, mode: str, out: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), backend_url, lock_name, str(TTL), mode, str(out)],
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
    )
    try:
        assert worker.stdout is not None
        ready = json.loads(worker.stdout.readline())
        os.kill(worker.pid, signal.SIGSTOP)
        second = client.lock(lock_name, ttl=TTL)
        try:
            assert second.acquire(timeout=TTL + 10), "the frozen holder's lease did not expire"
            assert second.token > ready["token"]
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert worker.wait(30) == 0
        with out.open("a") as next_writes:
            next_writes.write(f"next {second.token}\n")  # the next holder proceeds
        second.release()
    finally:
        worker.kill()
        worker.wait()
    lines = out.read_text().splitlines()
    kinds = [line.split()[0] for line in lines]
    assert kinds[-3:] == ["lost", "stopped", "next"], lines[-5:]
    lost_at, stopped_at = (float(line.split()[1]) for line in lines[-3:-1])
    assert all(float(line.split()[1]) < stopped_at for line in lines if line.startswith("write"))  # none after
    # on_lost runs on the keeper's clean-up thread beside the stop: either may come first, by a few ms
    print(f"{mode}: stopped {stopped_at - lost_at:+.4f} s from on_lost")
    assert stopped_at - lost_at < STOP_BOUND


@pytest.mark.real_server
@pytest.mark.parametrize("backend", ["etcd", "redis"], indirect=True)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_frozen_holder_stops_its_body_once_thawed_and_the_next_holder_proceeds(
    backend_url: str, client: distlock.Client, lock_name: str, mode: str, tmp_path: Path
) -> None:
    _run_frozen_holder(backend_url, client, lock_name, mode, tmp_path / "writes")
