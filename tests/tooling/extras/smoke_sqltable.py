"""Smoke test of ``distlock-fenced[sqltable]``, ``[sqltable-postgresql]`` or ``[sqltable-mysql]`` installed alone:
connect, lock, read the token, list the lock. Argument: a sql+... URL of the extra's database."""

import sys

import distlock

with distlock.connect(sys.argv[1]) as client, client.lock("smoke/sqltable", ttl=5, timeout=10) as lock:
    assert lock.token > 0 and distlock.current_token() == lock.token
    assert [state.holder.token for state in client.inspect() if state.name == "smoke/sqltable"] == [lock.token]
print("ok")
