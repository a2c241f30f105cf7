"""The ZooKeeper backend (``zk://``; the ``zookeeper`` extra): ephemeral sequential znodes through kazoo, in
``_backend``.

Importing this package imports no client library; ``_backend`` imports kazoo and is loaded only when a zk URL is
used; ``_url`` parses its URLs, importing nothing.
"""
