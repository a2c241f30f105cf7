"""``StaleFenceToken`` as SQLAlchemy users catch it: a ``distlock.StaleFenceToken`` that is also a ``StaleDataError``.

The database refused a write (0 rows matched where 1 was expected) for one of three reasons, and the message (from
``distlock.stale_token_message``, shared with Django) says which, after reading the row's token: the row carries a
newer token (a newer lock holder claimed it: this holder is stale), the row is gone, or (a flush of an object read
before it was claimed) the row was written since it was read.
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
    what: str,
    token: int | None,
    row: Any,
    current: int | None,
    *,
    family: str,
    read: int | None = None,
    lock: str | None = None,
) -> StaleFenceToken:
    """The error for ``what`` (``"update of Account pk=1"``), refused although written with ``token``, counted in
    the ``distlock.fence.refused`` metric under ``family`` (the row's lock template)."""
    message = distlock.fence_refused(what, token, current, read=read, lock=lock, family=family)
    return StaleFenceToken(message, token=token, row=row, current=current)
