"""Lock services behind one seam: a module per service, each only translating the protocol and its errors.

A backend implements the handful of primitives of ``distlock._protocol.Backend`` (grant, refresh and revoke a
lease; join a lock's queue, read a ticket's place, wait for the waiter ahead, leave the queue) for one lock
service, and turns that service's client errors into :mod:`distlock` errors. Queueing, timeouts, renewal and
fencing are written once above it, in ``distlock._lock`` and ``distlock._session``; a backend holds no lock logic
of its own.

- ``_etcd``: etcd's v3 gRPC API (``etcd://``, ``etcds://``), needs the ``etcd`` extra (grpcio, python3-etcd3).
- ``_redis``: Lua scripts on a Redis server or Cluster (``redis://``, ``rediss://``, ``redis+cluster://``,
  ``rediss+cluster://``), needs the ``redis`` extra (redis-py).

``distlock.connect(url)`` chooses the backend by the URL's scheme and imports its module only then, so importing
:mod:`distlock` never imports grpc or redis-py, and a missing extra is a ``ConfigurationError`` naming the extra
to install. This package therefore imports neither client library itself.
"""
