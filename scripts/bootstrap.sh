# Sourced by the scripts in this folder: make .venv (Python >= 3.11) with distlock (the distlock-fenced distribution) installed, editable, with the
# extras named in $DISTLOCK_EXTRAS (default: dev). Re-installs when pyproject.toml changes. Needs only python3 and
# the package index; on Debian without the venv module it installs python3-venv when run as root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${DISTLOCK_EXTRAS:-dev}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "distlock needs Python >= 3.11 (found: $("$python" --version 2>&1 || echo none)); set PYTHON=..." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$python" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "python3 has no venv module; installing Debian's python3-venv" >&2
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      "$python" -m venv .venv
    else
      echo "python3 cannot create a virtual environment: install python3-venv (Debian/Ubuntu) and retry" >&2
      exit 1
    fi
  fi
fi
sum="$(cksum pyproject.toml | cut -d' ' -f1)"
stamp=".venv/.distlock-$extras-$sum"
# dev includes every extra the demo needs: one install serves both commands.
if [ ! -f "$stamp" ] && [ ! -f ".venv/.distlock-dev-$sum" ]; then
  echo "installing distlock-fenced[$extras] into .venv ..." >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[$extras]"
  find .venv -maxdepth 1 -name '.distlock-*' ! -name "*-$sum" -delete
  touch "$stamp"
fi
