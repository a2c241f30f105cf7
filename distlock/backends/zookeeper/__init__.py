"""The ZooKeeper backend (``zk://``; the ``zookeeper`` extra): ephemeral sequential znodes through kazoo, in
``_backend`` (the protocol) and ``_sessions`` (a kazoo session per lease, requests on them).

Importing this package imports no client library; ``_backend`` imports kazoo (and then ``_sessions``) and is loaded
only when a zk URL is used; ``_url`` parses its URLs, importing nothing.
"""
