"""The in-memory reference backend's own behaviour: its URL, servers shared by name, leases that expire on their own
(the lock contract itself runs on it through the ``backend`` matrix, as "memory")."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from types import MappingProxyType

import pytest

import distlock
from distlock._protocol import KINDS, RECORDS, Interrupt
from distlock.testing import MemoryBackend


@pytest.fixture
def url() -> str:
    return f"memory://{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("memory://x/path", {}, "has a path '/path'"),
        ("memory://x?colour=red", {}, "known: prefix"),
        ("memory://x", {"username": "me"}, "known: connect_timeout, prefix, request_timeout"),
        ("memory://x?prefix=a/", {}, "must be non-empty"),
        ("memory://x", {"request_timeout": -1}, "request_timeout"),
    ],
)
def test_a_bad_memory_url_or_option_raises_configuration_error(
    url: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(distlock.ConfigurationError, match=message):
        distlock.connect(url, **options)


def test_clients_of_one_name_contend_and_other_names_or_prefixes_do_not(url: str) -> None:
    with (
        distlock.connect(url) as first,
        distlock.connect(url) as second,
        distlock.connect(f"{url}-other") as elsewhere,
        distlock.connect(f"{url}?prefix=other") as other_prefix,
    ):
        with first.lock("job"):
            assert not second.lock("job").acquire(timeout=0)
            assert elsewhere.lock("job").acquire(timeout=0)
            assert other_prefix.lock("job").acquire(timeout=0)
            assert [state.name for state in second.inspect()] == ["job"]
        assert second.lock("job").acquire(timeout=0)
    assert "memory://" in first.description


def test_tokens_strictly_increase_across_the_locks_of_a_server(url: str) -> None:
    with distlock.connect(url) as client:
        tokens = []
        for name in ("a", "b", "a", "c", "b"):
            with client.lock(name) as lock:
                tokens.append(lock.token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_lease_that_runs_out_takes_its_entries_and_wakes_the_waiter_behind(url: str) -> None:
    """Nobody refreshes the holder's short lease: a wait far longer than it ends when the lease does, held."""
    backend = MemoryBackend(url.removeprefix("memory://"))
    short, long = backend.grant_lease(0.2), backend.grant_lease(60)
    holder, _ = backend.enqueue("job", short, "a" * 16, b"")
    waiter, position = backend.enqueue("job", long, "b" * 16, b"")
    assert not position.held and position.ahead == holder.key
    assert backend.wait(waiter, position, 30, Interrupt()) == backend.position(waiter)
    assert backend.position(waiter).held and backend.position(holder).gone
    assert backend.keep_alive(short, [], 1) <= 0 and backend.missing_tickets([waiter]) == []
    with pytest.raises(distlock.BackendError, match=r"lease .* is gone"):
        backend.enqueue("job", short, "c" * 16, b"")


def test_a_wait_ends_when_its_interrupt_fires_or_its_client_closes(url: str) -> None:
    backend = MemoryBackend(url.removeprefix("memory://"))
    lease = backend.grant_lease(60)
    backend.enqueue("job", lease, "a" * 16, b"")
    waiter, position = backend.enqueue("job", lease, "b" * 16, b"")
    interrupt = Interrupt()
    threading.Timer(0.05, interrupt.fire, ("cancelled",)).start()
    assert backend.wait(waiter, position, None, interrupt) is None
    threading.Timer(0.05, backend.close).start()
    assert backend.wait(waiter, position, None, Interrupt()) is None
    with pytest.raises(distlock.ClientClosed):
        backend.position(waiter)


def test_a_repeated_join_returns_the_same_entry_and_discard_removes_it(url: str) -> None:
    backend = MemoryBackend(url.removeprefix("memory://"))
    lease = backend.grant_lease(60)
    first, _ = backend.enqueue("job", lease, "a" * 16, b"")
    again, position = backend.enqueue("job", lease, "a" * 16, b"")
    assert (again.token, again.key, again.resent) == (first.token, first.key, True) and position.held
    assert backend.discard("job", lease, "a" * 16) == first.token
    assert not backend.dequeue(first)
    assert backend.discard("job", lease, "a" * 16) is None


def test_the_distlock_command_refuses_memory_urls_it_cannot_see(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The command runs in a process of its own: a memory:// service there is another, empty one. It says so."""
    from distlock._cli import BAD_INPUT, main

    assert main(["--url", url, "list"]) == BAD_INPUT
    assert "the distlock command (another process) is not available on in-memory locks" in capsys.readouterr().err


def test_a_capability_a_backend_lacks_is_refused_at_the_call_that_asks_for_it(url: str) -> None:
    """``Backend.unsupported`` names what a backend cannot do; the client refuses it where the user asks, with the
    backend's reason, and nothing reaches the service."""

    class NoRecords(MemoryBackend):
        unsupported: Mapping[str, str] = MappingProxyType(
            {RECORDS: "it keeps no records (test)", KINDS: "no kinds here (test)"}
        )

    client = distlock.Client(NoRecords(url.removeprefix("memory://")))
    with client:
        with pytest.raises(distlock.ConfigurationError, match=r"election .e. is not available on .*no records"):
            client.election("e")
        with pytest.raises(distlock.ConfigurationError, match=r"semaphore .s. is not available on .*no kinds"):
            client.semaphore("s", 2)
        with pytest.raises(distlock.ConfigurationError, match="read/write lock 'r' is not available"):
            client.rwlock("r")
        assert client.inspect() == []  # nothing was queued
