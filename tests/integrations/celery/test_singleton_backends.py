"""The singleton races on the other lock services: the run-mode overlap check and the SIGKILLed worker, with a worker
of its own on Redis, ZooKeeper and a PostgreSQL lock table (the rest of ``tests/integrations/celery`` runs on etcd).

The two tests are ``test_singleton_run``'s own, collected here a second time: this module's fixtures replace the
session's etcd-backed app and worker, so they run unchanged against each lock service.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

# pytest puts this directory on sys.path (it is no package: see celeryapp.py); mypy's path is tests/ only.
from test_singleton_run import (  # type: ignore[import-not-found]  # noqa: F401 (collected again, on these fixtures)
    test_a_sigkilled_worker_frees_the_lock_within_ttl,
    test_ten_concurrent_delays_never_overlap_and_each_duplicate_gets_its_option,
)

pytestmark = pytest.mark.parametrize("backend", ["redis", "zookeeper", "postgres-table"], indirect=True)


@pytest.fixture(scope="module")
def celery_urls(backend: str, backend_url: str, redis_url: str) -> tuple[str, str, str, str]:
    """Broker and result backend as the session's; the lock service of ``backend``; a queue of its own."""
    base = redis_url.rsplit("/", 1)[0]
    return f"{base}/0", f"{base}/1", backend_url, f"distlock-tests-{backend}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def celery_app(celery_urls: tuple[str, str, str, str], make_celery_app: Callable[..., Celery]) -> Celery:
    return make_celery_app(*celery_urls)


@pytest.fixture(scope="module")
def celery_worker(
    celery_urls: tuple[str, str, str, str],
    celery_app: Celery,
    celery_events: Any,
    start_celery_worker: Callable[..., Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    with start_celery_worker(celery_urls, celery_app, celery_events, tmp_path_factory.mktemp("worker")) as worker:
        assert worker.process.poll() is None
        yield worker
