"""``python -m distlock``: the ``distlock`` command line (list locks, show one, force-release; see ``_cli.py``)."""

from __future__ import annotations

import sys

from ._cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
