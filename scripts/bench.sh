#!/usr/bin/env bash
# Set up .venv and run the etcd lock benchmark (about a minute on 2 cores; it starts its own etcd, or takes
# --etcd-url etcd://HOST:PORT), then record the figures in docs/BENCHMARKS.md. Arguments go to the benchmark;
# --help lists them.
DISTLOCK_EXTRAS=etcd,testing source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/python -m benchmarks.etcd_locks "$@"
