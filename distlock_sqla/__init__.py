"""distlock_sqla: SQLAlchemy rows that the database itself protects from stale lock holders.

A model mixes in :class:`FencedMixin` and names the lock that guards each row; inside that lock, flushes and the
``fenced_*`` helpers carry the lock's fencing token, and the database refuses writes from a holder whose lock has
passed to someone else::

    from distlock_sqla import FencedMixin, claim_one

    class Account(FencedMixin, Base):
        __tablename__ = "accounts"
        fence_lock = "account:{id}"
        id: Mapped[int] = mapped_column(primary_key=True)
        balance: Mapped[int]

    with client.lock(f"account:{account_id}", ttl=30), Session(engine) as session, session.begin():
        account = claim_one(session, Account, account_id)  # claim, then read (docs/design.md: claim-on-read)
        account.balance += 10  # flushed with WHERE fence_token = :t; a stale holder gets StaleFenceToken

Works with ``Session``/``Connection`` and ``AsyncSession``/``AsyncConnection``; never imports Django. Which writes
are fenced, strict mode and the storage-level guard (:func:`fence_guard`): docs/integrations/sqlalchemy.md.

What can go wrong: an unfenceable model or table fails when declared (``ConfigurationError``, ``InvalidKeyTemplate``);
importing it without SQLAlchemy raises ``ModuleNotFoundError`` naming the ``sqlalchemy`` extra; a refused write raises
:class:`StaleFenceToken`, another lock's token ``LockNotOwned``, and a fenced helper (or a strict flush) outside the
row's lock ``UnfencedWrite``.
"""

from distlock import UnfencedWrite, require_extra

require_extra("sqlalchemy", extra="sqlalchemy", integration="distlock_sqla")

from ._errors import StaleFenceToken
from ._flush import STRICT
from ._guard import FenceGuard, fence_guard
from ._mixin import FencedMixin, fenced_mapper_args
from ._ops import claim, claim_one, fenced_delete, fenced_insert, fenced_update
from ._spec import FenceSpec, fenced_table, spec_of

__all__ = [
    "STRICT",
    "FenceGuard",
    "FenceSpec",
    "FencedMixin",
    "StaleFenceToken",
    "UnfencedWrite",
    "claim",
    "claim_one",
    "fence_guard",
    "fenced_delete",
    "fenced_insert",
    "fenced_mapper_args",
    "fenced_table",
    "fenced_update",
    "spec_of",
]
