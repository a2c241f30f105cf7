"""The etcd backend (``etcd://``, ``etcds://``; the ``etcd`` extra): ``_backend`` speaks etcd's v3 gRPC API.

Importing this package imports no client library; ``_backend`` imports grpc and is loaded only when an etcd URL is
used; ``_url`` parses its URLs, importing nothing.
"""
