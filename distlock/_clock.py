"""The clock every deadline in distlock is measured on.

Lease deadlines must not move when the wall clock is set, and must keep running while the machine sleeps: a laptop
suspended for an hour has lost its locks even though no process observed time pass. ``CLOCK_BOOTTIME`` (Linux) is
monotonic and counts suspend; elsewhere ``time.monotonic`` is the best available.

What can go wrong: off Linux, ``time.monotonic`` may stop while the machine sleeps (macOS does), so after a suspend
a lease deadline is reached late: the holder learns of the loss only at its next refresh, which the server answers
"lease gone". Fenced writes are unaffected.
"""

from __future__ import annotations

import time

__all__ = ["now"]

if hasattr(time, "CLOCK_BOOTTIME"):
    _BOOTTIME = time.CLOCK_BOOTTIME

    def now() -> float:
        """Seconds on a monotonic clock that also counts system suspend."""
        return time.clock_gettime(_BOOTTIME)

else:  # pragma: no cover - non-Linux
    now = time.monotonic
