"""Smoke test of ``distlock-fenced[zookeeper]`` installed alone: connect, lock, read the token. Argument: a zk URL."""

import sys

import distlock

with distlock.connect(sys.argv[1]) as client, client.lock("smoke/zookeeper", ttl=5, timeout=10) as lock:
    assert lock.token > 0 and distlock.current_token() == lock.token
print("ok")
