"""Migrations of distlock_django: one unmanaged model, so no table is ever created."""
