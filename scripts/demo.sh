#!/usr/bin/env bash
# Set up .venv and run the demo: processes contend for one etcd lock on a throwaway local etcd (or --etcd URL),
# one holder is frozen past its lease, and the fencing tokens show why its late write is refused.
# Arguments go to the demo; --help lists them.
DISTLOCK_EXTRAS=etcd,testing source "$(dirname "$0")/bootstrap.sh"
exec .venv/bin/python -m scripts.demo "$@"
