"""One validator for every "number of seconds" distlock takes: lease TTLs, wait timeouts, hold bounds, connect options.

A duration is a real number (not a bool, not a numeric string), not NaN, not negative, zero only where zero means
"do not wait", and at most :data:`MAX_SECONDS` (ten years). The bound is what every backend can honour: etcd keeps
a lease TTL as int64 seconds, Redis a ``PEXPIRE`` as int64 milliseconds, and the session keeper waits on a
``threading.Condition``, whose ``wait()`` raises ``OverflowError`` past ``threading.TIMEOUT_MAX`` (about 292
years on Linux; less elsewhere) — a ``ttl=1e12`` once killed the keeper thread that way. ``math.inf`` is accepted
only where it means "forever" (how long a lock waits), never for something that is stored or scheduled.

What can go wrong: a bad value raises :class:`~distlock.ConfigurationError` naming the setting and the value. The
integrations validate their own settings with it too, so a Django ``DISTLOCK['TTL']`` or a Celery ``lock_ttl``
fails the same way a ``client.lock(ttl=...)`` does.
"""

from __future__ import annotations

import math
from typing import Literal, overload

from ._errors import ConfigurationError

__all__ = ["MAX_SECONDS", "seconds"]

#: Ten years: the longest duration distlock accepts (see the module docstring for why).
MAX_SECONDS = 315_360_000.0


@overload
def seconds(
    value: object,
    what: str,
    *,
    allow_zero: bool = ...,
    allow_forever: bool = ...,
    allow_none: Literal[False] = ...,
) -> float: ...


@overload
def seconds(
    value: object,
    what: str,
    *,
    allow_zero: bool = ...,
    allow_forever: bool = ...,
    allow_none: bool,
) -> float | None: ...


def seconds(
    value: object,
    what: str,
    *,
    allow_zero: bool = False,
    allow_forever: bool = False,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a float number of seconds, or raise :class:`~distlock.ConfigurationError` naming ``what``.

    ``what`` names the setting in the message (``"ttl (the lease length)"``, ``"DISTLOCK['TTL']"``).
    ``allow_zero``: 0 is accepted (else the value must be > 0). ``allow_forever``: ``math.inf`` is accepted and
    returned as is. ``allow_none``: None is accepted and returned (for "no bound").
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be a finite number of seconds, not {type(value).__name__}: {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.nan if value < 0 else MAX_SECONDS * 2
    if math.isnan(number) or (math.isinf(number) and not (allow_forever and number > 0)):
        raise ConfigurationError(f"{what} must be a finite number of seconds, not {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        raise ConfigurationError(f"{what} must be {'>= 0' if allow_zero else '> 0'} seconds, not {value!r}")
    if MAX_SECONDS < number < math.inf:
        forever = "; math.inf waits forever" if allow_forever else ""
        bound = f"at most {MAX_SECONDS:.0f} seconds (ten years){forever}"
        raise ConfigurationError(f"{what} must be {bound}, not {value!r}")
    return number
