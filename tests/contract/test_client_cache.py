"""``ClientCache``: one shared client per URL and options, connected on first use and again once closed."""

from __future__ import annotations

import threading

import distlock


def test_one_client_per_url_and_options_until_it_is_closed(etcd_url: str) -> None:
    cache = distlock.ClientCache()
    try:
        client = cache.get(etcd_url, {"connect_timeout": 2})
        assert cache.get(etcd_url, {"connect_timeout": 2}) is client
        assert cache.get(etcd_url) is not client  # other options, another client
        client.close()
        again = cache.get(etcd_url, {"connect_timeout": 2})
        assert again is not client and not again.closed
    finally:
        cache.clear()
    assert again.closed


def test_threads_share_one_client(etcd_url: str) -> None:
    cache = distlock.ClientCache()
    got: list[distlock.Client] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(etcd_url))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(got) == 8 and all(client is got[0] for client in got)
    finally:
        cache.clear()
