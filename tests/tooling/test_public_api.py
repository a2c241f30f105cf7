"""The exported surface stays exported, and the error tree stays what the docs draw."""

from __future__ import annotations

import pickle
import subprocess
import sys
import traceback

import pytest
from _support import child_env

import distlock
import distlock._errors
import distlock.backends

CONTRACT = {
    "AsyncElection", "AsyncLock", "AsyncMultiLock", "AsyncRWLock", "AuthenticationFailed", "BackendError",
    "BackendUnavailable", "Client", "ClientCache", "ClientClosed", "ConfigurationError", "DistlockError", "Election",
    "Fence", "Holder", "InvalidKeyTemplate", "InvalidLockName", "KeyTemplate", "Leader", "Lock", "LockError",
    "LockKindMismatch", "LockLost", "LockNotAcquired", "LockNotOwned", "LockOptions", "LockState", "MultiLock",
    "RWLock", "STOP_SIGNAL", "StaleFenceToken", "UnfencedWrite", "Waiter", "connect", "current_fence", "current_lock",
    "current_token", "fence_for", "fence_for_write", "fence_refused", "format_lock_table", "seconds",
    "stale_token_message",
}  # fmt: skip


def test_exported_names_stay_exported() -> None:
    assert set(distlock.__all__) >= CONTRACT
    assert distlock.__all__ == sorted(distlock.__all__)
    for name in distlock.__all__:
        assert hasattr(distlock, name), name


def test_the_scheme_table_is_public() -> None:
    assert set(distlock.backends.__all__) == {"SCHEMES", "BackendConfig", "Scheme", "parse_url", "scheme_of"}
    schemes = {"etcd", "etcds", "redis", "rediss", "redis+cluster", "rediss+cluster", "zk"}
    schemes |= {"sql+postgresql", "sql+mysql", "sql+mariadb", "sql+sqlite", "memory"}
    assert schemes <= set(distlock.backends.SCHEMES)
    assert distlock.backends.scheme_of("SQL+PostgreSQL+psycopg2") is distlock.backends.SCHEMES["sql+postgresql"]
    assert distlock.backends.scheme_of("sql+oracle") is None


def test_the_testing_harness_names_stay_exported() -> None:
    import distlock.testing

    harness = {"EtcdCluster", "EtcdServer", "MariaDBServer", "MemoryBackend", "PostgresServer", "RedisServer"}
    harness |= {"ZooKeeperEnsemble", "ZooKeeperServer", "parse_prometheus_text"}
    assert set(distlock.testing.__all__) >= harness
    assert distlock.testing.__all__ == sorted(distlock.testing.__all__)
    for name in distlock.testing.__all__:
        assert hasattr(distlock.testing, name), name


@pytest.mark.parametrize(
    ("error", "parents"),
    [
        (distlock.ConfigurationError, (distlock.DistlockError, ValueError)),
        (distlock.InvalidLockName, (distlock.ConfigurationError,)),
        (distlock.InvalidKeyTemplate, (distlock.ConfigurationError,)),
        (distlock.BackendUnavailable, (distlock.BackendError, ConnectionError)),
        (distlock.AuthenticationFailed, (distlock.BackendError,)),
        (distlock.LockNotAcquired, (distlock.LockError,)),
        (distlock.LockNotOwned, (distlock.LockError,)),
        (distlock.LockLost, (distlock.LockError,)),
        (distlock.LockKindMismatch, (distlock.LockError,)),
        (distlock.StaleFenceToken, (distlock.DistlockError,)),
        (distlock.UnfencedWrite, (distlock.DistlockError,)),
    ],
)
def test_error_tree(error: type[Exception], parents: tuple[type[Exception], ...]) -> None:
    assert issubclass(error, parents)
    assert issubclass(error, distlock.DistlockError)


def test_errors_are_named_where_users_import_them_and_pickle() -> None:
    """A traceback reads ``distlock.LockLost: ...`` (not the private module), and an error crosses a process (pickle,
    as multiprocessing and Celery's result backends send it) with its attributes."""
    for name in distlock._errors.__all__:
        error = getattr(distlock, name)
        assert error.__module__ == "distlock", name
        assert traceback.format_exception_only(error("boom"))[-1] == f"distlock.{name}: boom\n"
    stale = pickle.loads(pickle.dumps(distlock.StaleFenceToken("refused", token=3, row=7, current=5)))
    assert (type(stale), str(stale), stale.token, stale.row, stale.current) == (
        distlock.StaleFenceToken,
        "refused",
        3,
        7,
        5,
    )
    lost = pickle.loads(pickle.dumps(distlock.LockLost("gone", name="orders:7")))
    assert (type(lost), lost.name) == (distlock.LockLost, "orders:7")


def test_importing_distlock_imports_no_framework() -> None:
    eager = "('django', 'grpc', 'kazoo', 'opentelemetry')"
    code = f"import sys, distlock, distlock_sqla; print(sorted(m for m in {eager} if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env())
    out = run.stdout
    assert out.strip() == "[]", "importing distlock pulled in a framework, the etcd client or OpenTelemetry eagerly"
