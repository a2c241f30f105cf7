"""``FencedMixin``: a typed declarative mixin that gives a model its ``fence_token`` column and its guarding lock.

::

    class Account(FencedMixin, Base):
        __tablename__ = "accounts"
        fence_lock = "account:{id}"  # the lock guarding each row, rendered from the row's columns
        id: Mapped[int] = mapped_column(primary_key=True)
        balance: Mapped[int]

The column is the mapper's ``version_id_col`` with ``version_id_generator=False``: every flushed UPDATE and DELETE
of the object carries ``WHERE fence_token = <the token it was read with>`` and its row count is checked, and the
flush hooks (``_flush``) set the new token. The template is checked when the class is mapped, so a template naming
a column the model lacks is an ``InvalidKeyTemplate`` at import time, not at the first write.

What can go wrong: a model that replaces ``__mapper_args__`` without :func:`fenced_mapper_args` (its flushes would
not be fenced) is refused with ``ConfigurationError`` when it is mapped; so is a model without ``fence_lock``, or a
subclass declaring a different lock than its table's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sqlalchemy import BigInteger, Column, event
from sqlalchemy.orm import Mapped, Mapper, declared_attr, mapped_column

from distlock import ConfigurationError, KeyTemplate

from ._spec import FENCE_COLUMN, FenceSpec, declare

__all__ = ["FencedMixin", "fenced_mapper_args"]


class FencedMixin:
    """Mix into a declarative model to fence its rows. Set ``fence_lock`` (required) and ``fence_strict``.

    ``fence_strict = True`` refuses every flush of the model's objects made outside its lock (``UnfencedWrite``);
    a session can be made strict for all fenced models with ``session.info[distlock_sqla.STRICT] = True``.
    """

    # No server_default: SQLAlchemy takes a version column with one for server-generated and reads it back with
    # RETURNING after every UPDATE (measured: +70 us, 8 % of a PostgreSQL ORM update). A migration adding the
    # column to a table with rows gives it a database-side DEFAULT 0 of its own.
    fence_token: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    fence_lock: ClassVar[str]
    fence_strict: ClassVar[bool] = False
    __fence_spec__: ClassVar[FenceSpec]

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:  # noqa: N805 - declared_attr is called with the class
        return fenced_mapper_args(cls)


def fenced_mapper_args(cls: Any, **extra: Any) -> dict[str, Any]:
    """``FencedMixin``'s mapper arguments plus ``extra``, for a fenced model that needs its own ``__mapper_args__``::

    @declared_attr.directive
    def __mapper_args__(cls) -> dict[str, Any]:
        return fenced_mapper_args(cls, polymorphic_on=cls.kind)
    """
    table = getattr(cls, "__table__", None)
    column = None if table is None else table.c.get(FENCE_COLUMN)
    if column is None:
        # A joined-inheritance subclass's own table: it inherits the base mapper's version column.
        return dict(extra)
    return {"version_id_col": column, "version_id_generator": False, **extra}


@event.listens_for(FencedMixin, "after_mapper_constructed", propagate=True)
def _declare(mapper: Mapper[Any], cls: type[Any]) -> None:
    """Check a fenced model when it is mapped (at import time) and record its :class:`FenceSpec`."""
    declared = getattr(cls, "fence_lock", None)
    if not declared:
        raise ConfigurationError(
            f"{cls.__name__} uses FencedMixin without fence_lock: declare the lock that guards each row, "
            'e.g. fence_lock = "account:{id}"'
        )
    template = KeyTemplate(declared)
    version = mapper.version_id_col
    if not isinstance(version, Column) or version.name != FENCE_COLUMN or mapper.version_id_generator is not False:
        raise ConfigurationError(
            f"{cls.__name__}: FencedMixin needs fence_token as the mapper's version_id_col, without a generator; "
            "a __mapper_args__ of your own must include distlock_sqla.fenced_mapper_args(cls, ...)"
        )
    cls.__fence_spec__ = declare(
        label=cls.__name__,
        what=f"{cls.__name__}.fence_lock {declared!r}",
        template=template,
        table=version.table,
        fence_column=version,
        pk_columns=tuple(mapper.primary_key),
        pk_keys=tuple(mapper.get_property_by_column(c).key for c in mapper.primary_key),
        columns=list(mapper.columns.keys()),
        attribute=lambda key: getattr(cls, key),  # ORM attributes: selecting them makes inheritance joins for us
        strict=bool(getattr(cls, "fence_strict", False)),
        model=cls,
    )
