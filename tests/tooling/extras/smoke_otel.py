"""Smoke test of ``distlock[etcd,otel]`` installed alone: the OpenTelemetry API without an SDK. Locks work, and
their measurements go to the API's own no-op instruments. Argument: an etcd URL."""

import sys

import distlock

with distlock.connect(sys.argv[1]) as client, client.lock("smoke/otel", ttl=5, timeout=10, family="smoke") as lock:
    assert lock.token > 0
    assert not client.lock("smoke/otel", timeout=0.1).acquire()
assert "opentelemetry.metrics" in sys.modules, "the first lock should have asked the API for its meter"
print("ok")
