"""``StaleFenceToken`` as SQLAlchemy users catch it, and the messages that say why a fenced write was refused.

The database refused a write (0 rows matched where 1 was expected) for one of three reasons, and the message says
which, after reading the row's token: the row carries a newer token (a newer lock holder claimed it: this holder is
stale), the row is gone, or (a flush of an object read before it was claimed) the row was written since it was read.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm.exc import StaleDataError

import distlock

__all__ = ["StaleFenceToken", "stale"]


class StaleFenceToken(distlock.StaleFenceToken, StaleDataError):
    """A fenced write or claim was refused by the database; also a SQLAlchemy ``StaleDataError``.

    ``token`` is the token written with (None for an unfenced flush), ``row`` the primary key (or, from a flush, the
    object), ``current`` the token found on the row afterwards (None if the row is gone).
    """


def stale(
    what: str, token: int | None, row: Any, current: int | None, *, read: int | None = None, lock: str | None = None
) -> StaleFenceToken:
    """The error for ``what`` (``"update of Account pk=1"``), refused although written with ``token``."""
    with_token = "without a fencing token (no lock held)" if token is None else f"with fencing token {token}"
    if current is None:
        why = "the row no longer exists"
    elif token is not None and current > token:
        holder = f"of lock {lock!r} " if lock else ""
        why = (
            f"the row carries the newer token {current}: a newer holder {holder}has claimed it, and this holder's "
            "work must not be written"
        )
    elif read is not None and current != read:
        why = (
            f"the row was written after this session read it (read with token {read}, now {current}). Claim rows "
            "(distlock_sqla.claim) inside the lock before reading what you will write back"
        )
    else:
        why = f"the row's token is {current}"
    return StaleFenceToken(f"{what} {with_token} refused: {why}", token=token, row=row, current=current)
