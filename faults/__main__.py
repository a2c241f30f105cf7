"""``python -m faults --short`` / ``--long``: see ``faults._runner``."""

import sys

from faults._runner import main

sys.exit(main())
