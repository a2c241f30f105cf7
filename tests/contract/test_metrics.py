"""Metrics through OpenTelemetry: what a contended run, lost locks and refused writes record, read back from the SDK.

The process gets one ``MeterProvider`` with an in-memory reader (OpenTelemetry allows one per process), set when
the first test here asks for it, possibly after other tests have taken locks: distlock's instruments follow it.
Measurements are cumulative over the whole session, so each test gives its locks a family of its own and reads only
the points of that family. The Prometheus endpoint, a process without OpenTelemetry and a broken SDK each run in a
fresh interpreter of their own.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import REPO, SQL_TABLES, LockServer, child_env, wait_until
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqla.models import Base, Counter
from sqlalchemy import create_engine, select, update
from sqlalchemy.orm import Session

import distlock
import distlock.testing
from distlock._protocol import Lease
from distlock_sqla import StaleFenceToken, claim_one

WAIT = "distlock.lock.wait_time"
HOLD = "distlock.lock.hold_time"
WAITERS = "distlock.lock.waiters"
LOST = "distlock.lock.lost"
REFUSED = "distlock.fence.refused"
ERRORS = "distlock.backend.errors"
FAST_FAILURES = "distlock.backend.fast_failures"
FAMILY = "distlock.lock.family"
OUTCOME = "distlock.lock.outcome"


@pytest.fixture(scope="session")
def reader() -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(provider)
    assert metrics.get_meter_provider() is provider, "another MeterProvider was set in this process before"
    return reader


@pytest.fixture
def family() -> str:
    """A family no other test uses, shaped like a template."""
    return f"metrics-{uuid.uuid4().hex[:8]}:{{id}}"


def points(reader: InMemoryMetricReader, name: str, **attributes: str) -> list[Any]:
    """The data points of instrument ``name`` whose attributes include ``attributes`` (dots spelled ``__``)."""
    wanted = {key.replace("__", "."): value for key, value in attributes.items()}
    data = reader.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            if scope.scope.name != "distlock":
                continue
            for metric in scope.metrics:
                if metric.name == name:
                    found += [p for p in metric.data.data_points if wanted.items() <= dict(p.attributes or {}).items()]
    return found


def count(reader: InMemoryMetricReader, name: str, **attributes: str) -> int:
    """Histogram observations, or a counter's total, over the matching points."""
    total = 0
    for point in points(reader, name, **attributes):
        total += int(point.count if hasattr(point, "count") else point.value)
    return total


def outcomes(reader: InMemoryMetricReader, family: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for point in points(reader, WAIT, distlock__lock__family=family):
        outcome = str(point.attributes[OUTCOME])
        found[outcome] = found.get(outcome, 0) + point.count
    return found


def test_a_contended_run_records_every_wait_with_its_outcome(
    reader: InMemoryMetricReader, client: distlock.Client, backend: str, lock_name: str, family: str
) -> None:
    patient, impatient = 4, 2
    gate = client.lock(lock_name, family=family)
    assert gate.acquire()
    # Waits that must end in a timeout: the lock stays held until they are over.
    timeouts = [client.lock(lock_name, family=family, timeout=0.2) for _ in range(impatient)]
    threads = [threading.Thread(target=lock.acquire) for lock in timeouts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not client.lock(lock_name, family=family).acquire(blocking=False)

    # An asyncio waiter cancelled while it waits.
    async def cancel_a_waiter() -> None:
        task = asyncio.create_task(client.async_lock(lock_name, family=family).acquire())
        deadline = asyncio.get_running_loop().time() + 10
        while count(reader, WAITERS, distlock__lock__family=family) < 1:
            assert asyncio.get_running_loop().time() < deadline, "the asyncio waiter was never counted"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_a_waiter())

    # Waits that end with the lock: each takes it in turn.
    got: list[bool] = []

    def take_turn() -> None:
        lock = client.lock(lock_name, family=family, timeout=30)
        if lock.acquire():
            got.append(True)
            lock.release()

    threads = [threading.Thread(target=take_turn) for _ in range(patient)]
    for thread in threads:
        thread.start()
    wait_until(lambda: count(reader, WAITERS, distlock__lock__family=family) == patient, 10, "every waiter counted")
    gate.release()
    for thread in threads:
        thread.join(30)
    assert got == [True] * patient

    label = "etcd" if backend.startswith("etcd") else "sqltable" if backend in SQL_TABLES else backend
    acquisitions, gave_up = 1 + patient, impatient + 1
    assert outcomes(reader, family) == {"acquired": acquisitions, "timeout": gave_up, "cancelled": 1}
    assert count(reader, WAIT, distlock__lock__family=family) == acquisitions + gave_up + 1
    assert count(reader, HOLD, distlock__lock__family=family) == acquisitions
    assert count(reader, WAITERS, distlock__lock__family=family) == 0
    assert {str(p.attributes["distlock.backend"]) for p in points(reader, WAIT, distlock__lock__family=family)} == {
        label
    }
    assert not any(lock_name in p.attributes.values() for p in points(reader, WAIT)), "a lock name became an attribute"


def test_an_acquire_that_raises_records_an_error(
    reader: InMemoryMetricReader, backend_url: str, lock_name: str, family: str
) -> None:
    other = distlock.connect(backend_url)
    lock = other.lock(lock_name, family=family)
    other.close()
    with pytest.raises(distlock.ClientClosed):
        lock.acquire()
    assert outcomes(reader, family) == {"error": 1}
    assert count(reader, WAITERS, distlock__lock__family=family) == 0


def test_locks_made_lost_are_counted(
    reader: InMemoryMetricReader, client: distlock.Client, backend_url: str, lock_name: str, family: str
) -> None:
    overstayed = client.lock(f"{lock_name}/a", family=family, max_hold=0.2)
    assert overstayed.acquire()
    revoked = client.lock(f"{lock_name}/b", family=family, ttl=3)
    assert revoked.acquire()
    holder = client.holder(revoked.name)
    assert holder is not None
    with distlock.connect(backend_url) as operator:
        # As an operator would, behind the holder's back.
        operator._backend.revoke_lease(Lease(holder.lease_id, 0.0), [])
    wait_until(lambda: overstayed.lost and revoked.lost, 15, "both locks to be lost")
    for lock in (overstayed, revoked):
        with pytest.raises(distlock.LockLost):
            lock.release()
    assert count(reader, LOST, distlock__lock__family=family) == 2
    assert count(reader, HOLD, distlock__lock__family=family) == 2, "a lost hold still records its hold time"
    kept = client.lock(f"{lock_name}/c", family=family)
    with kept:
        pass
    assert count(reader, LOST, distlock__lock__family=family) == 2


def test_fenced_writes_refused_are_counted_under_the_models_template(
    reader: InMemoryMetricReader, client: distlock.Client, tmp_path: Path
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    Base.metadata.create_all(engine)
    ids = [int(uuid.uuid4().int % 10**9) + i for i in range(2)]
    with Session(engine) as session, session.begin():
        session.add_all(Counter(id=i) for i in ids)
    before = count(reader, REFUSED, distlock__lock__family="counter:{id}")

    def newer_holder_claims(row_id: int, token: int) -> None:
        with engine.begin() as conn:
            conn.execute(update(Counter).where(Counter.id == row_id).values(fence_token=token))

    # A claim of a row a newer holder has claimed.
    with client.lock(f"counter:{ids[0]}") as lock, Session(engine) as session:
        newer_holder_claims(ids[0], lock.token + 1)
        with pytest.raises(StaleFenceToken):
            claim_one(session, Counter, ids[0])
    # A flush of a row read before a newer holder claimed it.
    with client.lock(f"counter:{ids[1]}") as lock, Session(engine) as session:
        row = session.scalars(select(Counter).where(Counter.id == ids[1])).one()
        newer_holder_claims(ids[1], lock.token + 1)
        row.value = 1
        with pytest.raises(StaleFenceToken):
            session.commit()
    engine.dispose()
    assert count(reader, REFUSED, distlock__lock__family="counter:{id}") == before + 2
    names = {f"counter:{i}" for i in ids}
    assert not any(names & set(p.attributes.values()) for p in points(reader, REFUSED)), "a lock name was recorded"


def test_requests_the_lock_service_fails_are_counted_by_error_type(
    reader: InMemoryMetricReader, lock_server: LockServer, lock_name: str
) -> None:
    with distlock.connect(lock_server.url, request_timeout=0.5) as client:
        assert client.holder(lock_name) is None
        unavailable = {"distlock__backend": lock_server.family, "error__type": "BackendUnavailable"}
        before = count(reader, ERRORS, **unavailable)
        lock_server.kill()
        with pytest.raises(distlock.BackendUnavailable):
            client.holder(lock_name)
        assert count(reader, ERRORS, **unavailable) > before


def test_calls_refused_by_the_circuit_breaker_are_counted(
    reader: InMemoryMetricReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = distlock.testing.MemoryBackend("fast-failures")

    def unreachable(name: str) -> None:
        raise distlock.BackendUnavailable("the in-memory server is down (a test's outage)")

    monkeypatch.setattr(backend, "head", unreachable)
    with distlock.Client(backend, fail_fast=60) as client:
        before = count(reader, FAST_FAILURES, distlock__backend="memory")
        with pytest.raises(distlock.BackendUnavailable, match="is down"):
            client.holder("a")  # asked the service: not a fast failure
        assert count(reader, FAST_FAILURES, distlock__backend="memory") == before
        for _ in range(2):
            with pytest.raises(distlock.BackendUnavailable, match="failing fast"):
                client.holder("a")
        assert count(reader, FAST_FAILURES, distlock__backend="memory") == before + 2


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (its own global MeterProvider, or none)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        check=False,
    )


def test_without_opentelemetry_locks_work_and_nothing_is_imported(backend_url: str, lock_name: str) -> None:
    run = _run(
        """
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "opentelemetry":
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        import distlock

        with distlock.connect(sys.argv[1]) as client:
            held = client.lock(sys.argv[2], family="f:{id}", max_hold=0.2)
            assert held.acquire()
            assert not client.lock(sys.argv[2], timeout=0.1).acquire()
            assert held.lost_event.wait(10)
            try:
                held.release()
            except distlock.LockLost:
                pass
            else:
                raise AssertionError("the release of a lost lock did not say so")
            with client.lock(sys.argv[2]) as again:
                assert again.token > 0
        assert not any(m.partition(".")[0] == "opentelemetry" for m in sys.modules)
        print("ok")
        """,
        backend_url,
        lock_name,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_a_provider_set_after_the_first_lock_receives_what_follows(etcd_url: str, lock_name: str) -> None:
    run = _run(
        """
        import sys
        import distlock
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        with distlock.connect(sys.argv[1]) as client:
            with client.lock(sys.argv[2], family="late:{id}"):
                pass  # no provider yet: recorded nowhere
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            with client.lock(sys.argv[2], family="late:{id}"):
                pass
        data = reader.get_metrics_data()
        print(sorted(
            (m.name, p.count)
            for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
            for p in m.data.data_points if m.name.endswith("_time")
        ))
        """,
        etcd_url,
        lock_name,
    )
    assert run.stdout.strip() == str([(HOLD, 1), (WAIT, 1)]), run.stdout + run.stderr


def test_a_failing_metrics_sdk_never_fails_a_lock(etcd_url: str, lock_name: str) -> None:
    run = _run(
        """
        import logging, sys
        import distlock
        from opentelemetry import metrics
        from opentelemetry.metrics import NoOpMeter, NoOpMeterProvider

        class Broken:
            def record(self, *args, **kwargs):
                raise RuntimeError("a broken view")
            add = record

        class BrokenMeter(NoOpMeter):
            def create_histogram(self, *args, **kwargs):
                return Broken()
            create_counter = create_up_down_counter = create_histogram

        class BrokenProvider(NoOpMeterProvider):
            def get_meter(self, *args, **kwargs):
                return BrokenMeter("broken")

        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        metrics.set_meter_provider(BrokenProvider())
        with distlock.connect(sys.argv[1]) as client:
            with client.lock(sys.argv[2], family="broken:{id}") as lock:
                assert not client.lock(sys.argv[2], timeout=0.1).acquire()
                assert lock.token > 0
        print("ok")
        """,
        etcd_url,
        lock_name,
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    assert run.stderr.count("recording a metric failed") == 1, run.stderr


def _documented_prometheus_setup() -> str:
    """The Prometheus set-up block of docs/operations/metrics.md, as written."""
    page = (REPO / "docs" / "operations" / "metrics.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "PrometheusMetricReader" in b]
    return str(block)


@pytest.fixture
def prometheus_app(etcd_url: str, lock_name: str) -> Iterator[int]:
    """A process set up as the docs say, serving /metrics on a free port after taking one lock; yields the port."""
    setup = _documented_prometheus_setup()
    assert "start_http_server(9464)" in setup
    # The one change: a free port, which the process then prints.
    setup = setup.replace("start_http_server(9464)", 'server, _ = start_http_server(0, addr="127.0.0.1")')
    code = setup + textwrap.dedent(
        """
        import sys
        import distlock

        with distlock.connect(sys.argv[1]) as client:
            with client.lock(sys.argv[2], family="prometheus:{id}"):
                pass
            print(server.server_port, flush=True)
            sys.stdin.readline()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, etcd_url, lock_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline()
        assert line.strip().isdigit(), f"the documented set-up did not start: {line!r}"
        yield int(line)
    finally:
        process.stdin.close()
        process.wait(30)
        process.stdout.close()


def test_the_documented_prometheus_setup_serves_the_metrics(prometheus_app: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_app}/metrics", timeout=10) as response:
        page = response.read().decode()
    family = 'distlock_lock_family="prometheus:{id}"'
    waits = [line for line in page.splitlines() if line.startswith("distlock_lock_wait_time_seconds_count{")]
    assert any(family in w and 'distlock_lock_outcome="acquired"' in w and w.endswith(" 1.0") for w in waits), page
    holds = [line for line in page.splitlines() if line.startswith("distlock_lock_hold_time_seconds_count{")]
    assert any(family in h and 'distlock_backend="etcd"' in h for h in holds), page
    assert "# TYPE distlock_lock_waiters gauge" in page


@pytest.mark.parametrize("family", ["", 5, "line\nbreak", "x" * 257])
def test_a_bad_family_is_refused_when_the_handle_is_made(client: distlock.Client, lock_name: str, family: Any) -> None:
    with pytest.raises(distlock.ConfigurationError, match="family"):
        client.lock(lock_name, family=family)
