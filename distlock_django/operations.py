"""Migration operations: the fence guard, a trigger that refuses any UPDATE lowering a fenced row's token.

    class Migration(migrations.Migration):
        dependencies = [("bank", "0001_initial")]
        operations = [InstallFenceGuard("Account")]

Fenced writes never lower ``fence_token``; a plain ``save()`` of an old instance, ``QuerySet.update()``, raw SQL or
another service can, and the guard makes the database refuse those from every writer. :func:`distlock.fence_guard_sql`
writes the trigger for the migration's database (PostgreSQL, SQLite, MySQL/MariaDB); unapplying drops it. The
operation changes no model state, honours ``allow_migrate``, and ``sqlmigrate`` shows its SQL.

What can go wrong: another database vendor, or a model without the field, fails the migration with
``ConfigurationError``. On SQLite a later migration that rebuilds the table drops its triggers: add
``InstallFenceGuard`` again after it. A refused UPDATE raises ``IntegrityError`` (PostgreSQL, SQLite) or
``OperationalError`` (MySQL/MariaDB, SQLSTATE 45000), with a message starting ``distlock fence guard:``, and writes
nothing.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from distlock import ConfigurationError, fence_guard_sql

__all__ = ["InstallFenceGuard"]


class InstallFenceGuard(Operation):
    """Install the fence guard on the table holding ``model_name``'s ``field`` (its token); reversed, drop it.

    For a multi-table inheritance child that is its parent's table: one guard per table is enough.
    """

    reversible = True
    reduces_to_sql = True

    def __init__(self, model_name: str, field: str = "fence_token") -> None:
        self.model_name = model_name
        self.field = field

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {} if self.field == "fence_token" else {"field": self.field}
        return type(self).__qualname__, [self.model_name], kwargs

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass  # a trigger is not part of the model state

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._run(app_label, schema_editor, to_state, drop=False)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._run(app_label, schema_editor, from_state, drop=True)

    def describe(self) -> str:
        return f"Install the distlock fence guard on {self.model_name}.{self.field}"

    @property
    def migration_name_fragment(self) -> str:
        return f"fence_guard_{self.model_name.lower()}"

    def references_model(self, name: str, app_label: str) -> bool:
        return name.lower() == self.model_name.lower()

    def _run(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, state: ProjectState, *, drop: bool) -> None:
        model: type[models.Model] = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        try:
            field = model._meta.get_field(self.field)
        except FieldDoesNotExist:
            field = None
        if not isinstance(field, models.Field) or field.column is None:
            raise ConfigurationError(
                f"InstallFenceGuard: {app_label}.{self.model_name} has no column {self.field!r} to guard"
            )
        # The table that holds the column: a multi-table child's token lives in its parent's table.
        table = field.model._meta.db_table
        create, drop_statements = fence_guard_sql(schema_editor.connection.vendor, table, column=field.column)
        for statement in drop_statements if drop else create:
            schema_editor.execute(statement, params=None)  # no parameters: no placeholder processing
