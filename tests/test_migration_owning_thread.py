"""Migration 0004: the owning-thread column is `thread_id` everywhere, and events written before it (with
`app_thread_id` / `target_thread_id` in their payloads) are rewritten so the projections rebuild from them."""

from __future__ import annotations

import json
import uuid

from tests.support.pg import PgServer
from threadloom.store import migrate
from threadloom.store.db import Database

COLUMNS = (
    "SELECT table_name, column_name FROM information_schema.columns "
    "WHERE table_name IN ('provider_threads', 'context_transfers') "
    "AND column_name IN ('thread_id', 'app_thread_id', 'target_thread_id', 'source_thread_id')"
)
INSERT_EVENT = (
    "INSERT INTO events (event_type, entity_type, entity_id, occurred_at, payload) VALUES ($1, $2, $3, now(), $4)"
)


async def test_upgrade_renames_the_columns_and_rewrites_old_events_and_downgrade_restores_them(pg: PgServer) -> None:
    url = await pg.fresh(migrated=False)
    db = Database.from_url(url, pool_size=1)
    conn = await pg.connect(url)
    try:
        await migrate.upgrade(db.engine, "0003_token_expiry")
        owner = str(uuid.uuid4())
        old_thread = {"id": str(uuid.uuid4()), "app_thread_id": owner, "provider_instance_id": "codex"}
        old_transfer = {"id": str(uuid.uuid4()), "source_thread_id": owner, "target_thread_id": owner}
        for event_type, entity_type, payload in (
            ("provider_thread.created", "provider_thread", old_thread),
            ("transfer.created", "context_transfer", old_transfer),
        ):
            await conn.execute(INSERT_EVENT, event_type, entity_type, uuid.UUID(payload["id"]), json.dumps(payload))

        await migrate.upgrade(db.engine)
        assert {tuple(r) for r in await conn.fetch(COLUMNS)} == {
            ("provider_threads", "thread_id"),
            ("context_transfers", "source_thread_id"),
            ("context_transfers", "thread_id"),
        }
        payloads = [json.loads(r["payload"]) for r in await conn.fetch("SELECT payload FROM events ORDER BY position")]
        assert payloads == [
            {"id": old_thread["id"], "thread_id": owner, "provider_instance_id": "codex"},
            {"id": old_transfer["id"], "source_thread_id": owner, "thread_id": owner},
        ]

        await migrate.downgrade(db.engine, "0003_token_expiry")
        payloads = [json.loads(r["payload"]) for r in await conn.fetch("SELECT payload FROM events ORDER BY position")]
        assert payloads == [old_thread, old_transfer]
        assert ("provider_threads", "app_thread_id") in {tuple(r) for r in await conn.fetch(COLUMNS)}
    finally:
        await conn.close()
        await db.dispose()
