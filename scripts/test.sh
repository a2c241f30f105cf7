#!/usr/bin/env bash
# Everything CI runs (.ci/run), in three steps: set up .venv (bootstrap.sh); provision the servers the fixtures start
# (servers.sh, once); then the whole suite on two pytest-xdist workers (a file's tests on one worker, each worker with
# servers of its own), with tox beside it: the version matrix (py311-oldest and, where a Python 3.13 runs,
# py313-newest, at once: tox.ini, each on ports of its own), then lint and types in tox's `lint` and `type`
# environments, as a contributor runs them. Arguments go to pytest: lint and types run first, then only those tests,
# in one process, and no matrix. tox's output follows the suite's, then the suite's closing line; the script fails if
# any step failed.
source "$(dirname "$0")/bootstrap.sh"
echo "== provisioning (scripts/servers.sh)"
bash scripts/servers.sh
# One command per line: under `set -e` a failure inside an `a && b` list (other than its last command) goes unnoticed.
matrix=0
if [ "$#" != 0 ]; then
  echo "== lint and types (tox -e lint,type)"
  .venv/bin/tox run -e lint,type
else
  set -- -n 2 --dist loadfile
  tox_path=$PATH
  if ! python3.13 --version >/dev/null 2>&1; then
    for dir in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin; do
      [ -x "$dir/python3.13" ] && tox_path="$dir:$PATH" && break
    done
  fi
  envs=py311-oldest
  if PATH=$tox_path python3.13 --version >/dev/null 2>&1; then
    envs=$envs,py313-newest
  else
    # A fresh Debian 12 has only Python 3.11: the newest releases that run there are what .venv has (the suite below).
    echo "== no Python 3.13 here: py313-newest (Django 6) left out; .venv tests the newest releases Python 3.11 gets"
  fi
  # Lint and types last, in the first free slot: about half a minute, off the suite's path (the matrix ends minutes
  # before the suite does).
  envs=$envs,lint,type
  matrix_log=$(mktemp -t distlock-matrix.XXXXXX)
  # Both environments at once (each on ports of its own, tox.ini): one after the other, the second ran alone for
  # minutes after the suite had finished, one core idle.
  PATH=$tox_path .venv/bin/tox run-parallel -p 2 --parallel-no-spinner -e "$envs" >"$matrix_log" 2>&1 &
  matrix_pid=$!
  trap 'kill "$matrix_pid" 2>/dev/null || true' EXIT  # an interrupted run leaves no tox behind
  echo "== tox ($envs) started beside the suite: its output follows the suite's"
fi
echo "== pytest"
suite=0
suite_log=$(mktemp -t distlock-suite.XXXXXX)
set +e
DISTLOCK_TEST_PORT_RANGE=15000-23999 .venv/bin/python -m pytest "$@" 2>&1 | tee "$suite_log"
suite=${PIPESTATUS[0]}
set -e
if [ -n "${matrix_pid:-}" ]; then
  wait "$matrix_pid" || matrix=1
  echo "== version matrix, lint and types (tox)"
  cat "$matrix_log"
  rm -f "$matrix_log"
  echo "== the whole suite (above the matrix):"
  # pytest's closing line, not whatever a client library printed at exit after it
  grep -E '^=+ .*[0-9]+ (passed|failed|errors?|skipped|deselected).* =+$' "$suite_log" | tail -n 1 || tail -n 1 "$suite_log"
fi
rm -f "$suite_log"
if [ "$matrix" != 0 ]; then
  echo "== the version matrix, lint or types failed (tox output above)" >&2
  exit 1
fi
exit "$suite"
