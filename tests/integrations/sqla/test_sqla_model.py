"""Declaring fenced models and tables: the column, the checks made at import time, the exported names."""

from __future__ import annotations

from typing import Any

import pytest
from sqla.models import Account, Counter, ledger
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column
from sqlalchemy.orm.exc import StaleDataError

import distlock
import distlock_sqla
from distlock_sqla import FencedMixin, StaleFenceToken, fenced_mapper_args, fenced_table, spec_of


def test_the_fence_token_column_is_a_non_null_bigint_defaulting_to_zero_in_python() -> None:
    column = Counter.__table__.c.fence_token
    assert isinstance(column.type, BigInteger)
    assert column.nullable is False
    assert column.default is not None and column.default.arg == 0
    assert column.server_default is None  # it would make every versioned UPDATE read the token back
    mapper = Counter.__mapper__
    assert mapper.version_id_col is column and mapper.version_id_generator is False


def test_the_spec_names_each_rows_lock_from_its_columns() -> None:
    assert spec_of(Counter).lock_name({"id": 7}) == "counter:7"
    assert spec_of(Account).template.fields == ("tenant",)
    assert spec_of(Counter()).table is Counter.__table__
    assert spec_of(ledger).lock_name({"account_id": 3}) == "ledger:3"


def test_a_template_naming_a_missing_column_fails_when_the_class_is_defined() -> None:
    class Base(DeclarativeBase):  # a registry of its own, so that failed classes leave nothing behind
        pass

    with pytest.raises(distlock.InvalidKeyTemplate, match=r"'owner'.*not a column of Order"):

        class Order(FencedMixin, Base):
            __tablename__ = "orders"
            fence_lock = "order:{owner}"
            id: Mapped[int] = mapped_column(primary_key=True)


def test_a_malformed_template_fails_when_the_class_is_defined() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(distlock.InvalidKeyTemplate, match="format spec"):

        class Order(FencedMixin, Base):
            __tablename__ = "orders"
            fence_lock = "order:{id!r}"
            id: Mapped[int] = mapped_column(primary_key=True)


def test_a_fenced_model_without_a_lock_template_fails_when_defined() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(distlock.ConfigurationError, match="without fence_lock"):

        class Order(FencedMixin, Base):
            __tablename__ = "orders"
            id: Mapped[int] = mapped_column(primary_key=True)


def test_own_mapper_args_that_drop_the_fence_are_refused() -> None:
    class Base(DeclarativeBase):
        pass

    with pytest.raises(distlock.ConfigurationError, match="fenced_mapper_args"):

        class Order(FencedMixin, Base):
            __tablename__ = "orders"
            fence_lock = "order:{id}"
            __mapper_args__ = {"eager_defaults": True}  # noqa: RUF012
            id: Mapped[int] = mapped_column(primary_key=True)


def test_own_mapper_args_can_keep_the_fence_with_fenced_mapper_args() -> None:
    class Base(DeclarativeBase):
        pass

    class Order(FencedMixin, Base):
        __tablename__ = "orders"
        fence_lock = "order:{id}"
        id: Mapped[int] = mapped_column(primary_key=True)
        kind: Mapped[str] = mapped_column(String(10))

        @declared_attr.directive
        def __mapper_args__(cls) -> dict[str, Any]:  # noqa: N805
            return fenced_mapper_args(cls, polymorphic_on=cls.__table__.c.kind, polymorphic_identity="order")

    class Refund(Order):
        __mapper_args__ = {"polymorphic_identity": "refund"}  # noqa: RUF012

    assert Order.__mapper__.version_id_col is Order.__table__.c.fence_token
    assert Refund.__mapper__.version_id_col is Order.__table__.c.fence_token
    assert spec_of(Refund).lock_name({"id": 1}) == "order:1"


def test_a_subclass_cannot_guard_its_rows_with_another_lock() -> None:
    class Base(DeclarativeBase):
        pass

    class Order(FencedMixin, Base):
        __tablename__ = "orders"
        fence_lock = "order:{id}"
        id: Mapped[int] = mapped_column(primary_key=True)
        kind: Mapped[str] = mapped_column(String(10))

        @declared_attr.directive
        def __mapper_args__(cls) -> dict[str, Any]:  # noqa: N805
            return fenced_mapper_args(cls, polymorphic_on=cls.__table__.c.kind, polymorphic_identity="order")

    with pytest.raises(distlock.ConfigurationError, match="one template per table"):

        class Refund(Order):
            fence_lock = "refund:{id}"
            __mapper_args__ = {"polymorphic_identity": "refund"}  # noqa: RUF012


def test_fenced_table_checks_the_table() -> None:
    metadata = MetaData()
    no_token = Table("a", metadata, Column("id", Integer, primary_key=True))
    with pytest.raises(distlock.ConfigurationError, match="fence_token"):
        fenced_table(no_token, "a:{id}")
    table = Table(
        "b", metadata, Column("id", Integer, primary_key=True), Column("fence_token", BigInteger, nullable=False)
    )
    with pytest.raises(distlock.InvalidKeyTemplate, match="'owner'"):
        fenced_table(table, "b:{owner}")
    assert fenced_table(table, "b:{id}") is table


def test_an_unfenced_model_or_table_is_a_configuration_error() -> None:
    with pytest.raises(distlock.ConfigurationError, match="not fenced"):
        spec_of(Table("c", MetaData(), Column("id", Integer, primary_key=True)))
    with pytest.raises(distlock.ConfigurationError, match="FencedMixin"):
        spec_of(object)


def test_stale_fence_token_is_caught_as_distlocks_and_as_sqlalchemys() -> None:
    error = StaleFenceToken("refused", token=3, row=1, current=4)
    assert isinstance(error, distlock.StaleFenceToken)
    assert isinstance(error, distlock.DistlockError)
    assert isinstance(error, StaleDataError)
    assert (error.token, error.row, error.current) == (3, 1, 4)
    assert str(error).startswith("refused")


def test_the_public_names_stay_exported() -> None:
    for name in distlock_sqla.__all__:
        assert getattr(distlock_sqla, name) is not None
    assert {"FencedMixin", "claim", "claim_one", "fenced_update", "fenced_delete", "fenced_insert"} <= set(
        distlock_sqla.__all__
    )
