"""Smoke test of ``distlock-fenced[etcd]`` installed alone: connect, lock, read the token. Argument: an etcd URL."""

import sys

import distlock

with distlock.connect(sys.argv[1]) as client, client.lock("smoke/etcd", ttl=5, timeout=10) as lock:
    assert lock.token > 0 and distlock.current_token() == lock.token
print("ok")
