"""Alembic environment: always given a connection by threadloom.store.migrate."""

from __future__ import annotations

from alembic import context

from threadloom.store.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise SystemExit("run migrations with `threadloom migrate`, not the alembic command")

context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
