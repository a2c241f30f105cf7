"""The etcd backend (``etcd://``, ``etcds://``; the ``etcd`` extra) over etcd's v3 gRPC API: ``_backend`` (the
protocol), ``_channels`` (members, failover, retries), ``_watch`` (waiters' watches).

Importing this package imports no client library; ``_backend`` imports grpc (and then ``_channels`` and ``_watch``)
and is loaded only when an etcd URL is used; ``_url`` parses its URLs, importing nothing.
"""
