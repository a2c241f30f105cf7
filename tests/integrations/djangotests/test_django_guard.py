"""``distlock_django.operations.InstallFenceGuard``: the trigger refusing any UPDATE that lowers ``fence_token``,
installed by a migration, on real SQLite, PostgreSQL and MariaDB.

The migration (``CreateModel`` of a fenced table, then ``InstallFenceGuard``) is applied and unapplied through a
schema editor as ``migrate`` does, so the test app keeps no migrations of its own (its tables are made by
``syncdb``, and other tests rely on that). After it: a raw ``UPDATE … SET fence_token = fence_token - 1``, a plain
``save()`` of an instance read before a newer write and ``QuerySet.update()`` lowering the token are refused and
change nothing; UPDATEs that keep, raise or leave the token pass; unapplying removes the guard. On the test app's
``Account``, fenced claims and saves still land under the guard, and a raw write putting an older token back does
not.

MariaDB: Django's MySQL backend needs mysqlclient (MySQLdb), a C extension that the dev extra does not install
(it builds against libmariadb's headers). Here the backend runs on PyMySQL standing in for it (loaded once by
conftest.py), on a connection added for the test to the session's MariaDB.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.db import IntegrityError, OperationalError, connections, migrations, models
from django.db.migrations.state import ProjectState
from django.db.migrations.writer import OperationWriter
from djangotests.testapp.models import Account

import distlock
from distlock.testing import MariaDBServer
from distlock_django import InstallFenceGuard, get_client, lock_name

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

REFUSED = "distlock fence guard: refused an UPDATE lowering"


@pytest.fixture(params=["default", "pg", "mariadb"], ids=["sqlite", "postgres", "mariadb"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database alias: the test databases pytest-django made, or one on the session's MariaDB for this test."""
    if request.param != "mariadb":
        yield request.param
        return
    server: MariaDBServer = request.getfixturevalue("mariadb_server")
    # Django's MySQL backend, on PyMySQL when mysqlclient is missing: loaded by conftest.py when pytest starts.
    from django.db.backends.mysql.base import DatabaseWrapper

    database = {"ENGINE": "django.db.backends.mysql", "NAME": "distlock", "USER": "distlock"}
    database.update({"PASSWORD": "distlock", "HOST": "127.0.0.1", "PORT": str(server.port)})
    configured = connections.configure_settings(
        {"default": {"ENGINE": "django.db.backends.dummy"}, "mariadb": database}
    )
    # A connection made here rather than in settings: Django's test case allows it (pytest-django made no test
    # database for it), and using("mariadb") finds it.
    connections["mariadb"] = DatabaseWrapper(configured["mariadb"], "mariadb")
    try:
        yield "mariadb"
    finally:
        connections["mariadb"].close()
        del connections["mariadb"]


def _guard_migration(table: str) -> migrations.Migration:
    """What a user's migration looks like: the fenced model, then its guard."""

    class Migration(migrations.Migration):
        operations = [  # noqa: RUF012  # as Django writes migrations
            migrations.CreateModel(
                "Ledger",
                [
                    ("id", models.AutoField(primary_key=True)),
                    ("value", models.IntegerField(default=0)),
                    ("fence_token", models.BigIntegerField(default=0)),
                ],
                options={"db_table": table},
            ),
            InstallFenceGuard("Ledger"),
        ]

    return Migration("0002_guard", "testapp")


@pytest.fixture
def ledger(alias: str) -> Iterator[tuple[str, Any]]:
    """The migration applied on ``alias``: (the table's quoted name, the migration state's ``Ledger`` model);
    unapplied afterwards (if the test has not)."""
    table = f"guard_ledger_{uuid.uuid4().hex[:8]}"
    migration = _guard_migration(table)
    connection = connections[alias]
    with connection.schema_editor() as editor:
        state = migration.apply(ProjectState(), editor)
    model = state.apps.get_model("testapp", "Ledger")
    try:
        yield connection.ops.quote_name(table), model
    finally:
        if table in connection.introspection.table_names():
            with connection.schema_editor() as editor:
                migration.unapply(ProjectState(), editor)


def _refusal(alias: str) -> type[Exception]:
    return OperationalError if connections[alias].vendor == "mysql" else IntegrityError


def _raw(alias: str, statement: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(statement)


def test_the_migration_installs_the_guard_and_a_raw_lowering_update_is_refused(
    alias: str, ledger: tuple[str, Any]
) -> None:
    table, model = ledger
    row = model.objects.using(alias).create(value=0, fence_token=5)
    with pytest.raises(_refusal(alias), match=REFUSED):
        _raw(alias, f"UPDATE {table} SET fence_token = fence_token - 1, value = 9")
    assert model.objects.using(alias).values_list("value", "fence_token").get() == (0, 5)
    _raw(alias, f"UPDATE {table} SET value = 1, fence_token = 5")
    _raw(alias, f"UPDATE {table} SET value = 2, fence_token = fence_token + 4")
    _raw(alias, f"UPDATE {table} SET value = 3")
    assert model.objects.using(alias).values_list("value", "fence_token").get() == (3, 9)
    row.value = 4  # an instance read at token 5; the row is at 9 now: a plain save() would lower it
    with pytest.raises(_refusal(alias), match=REFUSED):
        row.save(using=alias)
    with pytest.raises(_refusal(alias), match=REFUSED):
        model.objects.using(alias).update(value=5, fence_token=0)
    assert model.objects.using(alias).values_list("value", "fence_token").get() == (3, 9)


def test_unapplying_the_migration_removes_the_guard_and_installing_twice_is_fine(
    alias: str, ledger: tuple[str, Any]
) -> None:
    table, model = ledger
    model.objects.using(alias).create(value=0, fence_token=5)
    operation = InstallFenceGuard("Ledger")
    state = ProjectState()
    state.add_model(migrations.state.ModelState.from_model(model))
    with connections[alias].schema_editor() as editor:
        operation.database_forwards("testapp", editor, state, state)  # a second time: replaces the first
    with pytest.raises(_refusal(alias), match=REFUSED):
        _raw(alias, f"UPDATE {table} SET fence_token = 4")
    with connections[alias].schema_editor() as editor:
        operation.database_backwards("testapp", editor, state, state)
        operation.database_backwards("testapp", editor, state, state)  # dropping what is gone is no error
    _raw(alias, f"UPDATE {table} SET fence_token = 4")
    assert model.objects.using(alias).values_list("fence_token", flat=True).get() == 4


def test_a_multi_table_child_guards_its_parents_table(alias: str) -> None:
    suffix = uuid.uuid4().hex[:8]

    class Migration(migrations.Migration):
        operations = [  # noqa: RUF012  # as Django writes migrations
            migrations.CreateModel(
                "Vehicle",
                [("id", models.AutoField(primary_key=True)), ("fence_token", models.BigIntegerField(default=0))],
                options={"db_table": f"guard_vehicle_{suffix}"},
            ),
            migrations.CreateModel(
                "Car",
                [
                    (
                        "vehicle_ptr",
                        models.OneToOneField(
                            "testapp.Vehicle", models.CASCADE, parent_link=True, primary_key=True, serialize=False
                        ),
                    ),
                    ("seats", models.IntegerField(default=4)),
                ],
                options={"db_table": f"guard_car_{suffix}"},
                bases=("testapp.vehicle",),
            ),
            InstallFenceGuard("Car"),
        ]

    migration = Migration("0003_guard", "testapp")
    connection = connections[alias]
    with connection.schema_editor() as editor:
        state = migration.apply(ProjectState(), editor)
    try:
        car = state.apps.get_model("testapp", "Car").objects.using(alias).create(fence_token=5)
        vehicles = connection.ops.quote_name(f"guard_vehicle_{suffix}")
        with pytest.raises(_refusal(alias), match=REFUSED):
            _raw(alias, f"UPDATE {vehicles} SET fence_token = 4 WHERE id = {car.pk}")
    finally:
        with connection.schema_editor() as editor:
            migration.unapply(ProjectState(), editor)


@pytest.mark.usefixtures("django_servers")
@pytest.mark.parametrize("db_alias", ["default", "pg"], ids=["sqlite", "postgres"], indirect=True)
def test_fenced_writes_still_land_under_the_guard(db_alias: str) -> None:
    """On the test app's own ``Account`` (tables made by syncdb), the guard added and removed by the operation."""
    operation = InstallFenceGuard("Account")
    state = ProjectState.from_apps(apps)
    with connections[db_alias].schema_editor() as editor:
        operation.database_forwards("testapp", editor, state, state)
    try:
        account = Account.objects.create(balance=100)
        stale = Account.objects.get(pk=account.pk)
        with get_client().lock(lock_name(f"account:{account.pk}"), ttl=30) as lock:
            token = lock.token
            claimed = Account.objects.filter(pk=account.pk).fenced().get()
            claimed.balance += 1
            claimed.save()
        assert Account.objects.values_list("balance", "fence_token").get(pk=account.pk) == (101, token)
        table = connections[db_alias].ops.quote_name(Account._meta.db_table)
        with pytest.raises(IntegrityError, match=REFUSED):  # another writer putting back the token it read
            _raw(db_alias, f"UPDATE {table} SET balance = 0, fence_token = {stale.fence_token} WHERE id = {account.pk}")
        assert Account.objects.values_list("balance", "fence_token").get(pk=account.pk) == (101, token)
    finally:
        with connections[db_alias].schema_editor() as editor:
            operation.database_backwards("testapp", editor, state, state)


def test_the_operation_is_written_into_migrations_and_shows_its_sql() -> None:
    operation = InstallFenceGuard("Account")
    text, imports = OperationWriter(operation, indentation=0).serialize()
    assert text.startswith("distlock_django.operations.InstallFenceGuard(")
    assert "model_name='Account'" in text
    assert imports == {"import distlock_django.operations"}
    assert InstallFenceGuard("Account", field="token").deconstruct() == (
        "InstallFenceGuard",
        ["Account"],
        {"field": "token"},
    )
    assert operation.describe() == "Install the distlock fence guard on Account.fence_token"
    assert operation.migration_name_fragment == "fence_guard_account"
    assert operation.reversible
    assert operation.references_model("account", "testapp")
    state = ProjectState.from_apps(apps)
    with connections["default"].schema_editor(collect_sql=True) as editor:  # what sqlmigrate prints
        operation.database_forwards("testapp", editor, state, state)
    create = distlock.fence_guard_sql("sqlite", Account._meta.db_table).create
    assert editor.collected_sql == [f"{statement};" for statement in create]


def test_a_model_without_the_field_fails_the_migration() -> None:
    state = ProjectState.from_apps(apps)
    with (
        connections["default"].schema_editor(collect_sql=True) as editor,
        pytest.raises(distlock.ConfigurationError, match="no column 'token'"),
    ):
        InstallFenceGuard("Account", field="token").database_forwards("testapp", editor, state, state)
