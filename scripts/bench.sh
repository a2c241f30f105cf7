#!/usr/bin/env bash
# Set up .venv and run the benchmarks, each in one run against its own throwaway servers, recording the figures in
# docs/BENCHMARKS.md (each between its own markers; the rest of the file is left alone). About ten minutes on
# 2 cores for all nine.
#   bash scripts/bench.sh                  # etcd, handover, redis, zookeeper, sqltable, semaphore, sqla, django, celery
#   bash scripts/bench.sh etcd redis       # only those
#   bash scripts/bench.sh etcd --rounds 1000 --etcd-url etcd://HOST:PORT   # one benchmark with its arguments
#   bash scripts/bench.sh soak --count 10000   # the soak runs only when named: its default 100,000 rounds take hours
# `.venv/bin/python -m benchmarks.<name> --help` lists each benchmark's arguments.
set -euo pipefail
source "$(dirname "$0")/bootstrap.sh"
bash scripts/servers.sh  # redis-server, ZooKeeper and PostgreSQL for the Redis, ZooKeeper, SQLAlchemy, Django and
# Celery benchmarks
declare -A module=([etcd]=etcd_locks [handover]=etcd_handover [redis]=redis_locks [sqla]=sqla_fenced [django]=django_overhead [celery]=celery_overhead [zookeeper]=zookeeper_locks [sqltable]=sql_table_locks [semaphore]=semaphores [soak]=soak)
names=()
while [ $# -gt 0 ] && [ -n "${module[$1]:-}" ]; do names+=("$1"); shift; done
if [ $# -gt 0 ] && [ ${#names[@]} -ne 1 ]; then
  echo "arguments after the names go to one benchmark; name exactly one of: ${!module[*]} (got: ${names[*]:-none} $*)" >&2
  exit 2
fi
[ ${#names[@]} -gt 0 ] || names=(etcd handover redis zookeeper sqltable semaphore sqla django celery)
for name in "${names[@]}"; do
  echo "== benchmarks.${module[$name]}" >&2
  .venv/bin/python -m "benchmarks.${module[$name]}" "$@"
done
