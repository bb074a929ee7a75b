"""The per-operation context: who is asking, the loaders, and the engine's services."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
import strawberry

from threadloom.api.loaders import Loaders
from threadloom.domain.access import Principal
from threadloom.domain.statuses import TokenScope
from threadloom.engine.services import Services
from threadloom.store import tables as t
from threadloom.store.db import StatementCounter
from threadloom.streams.live import Live

# Until a WebSocket's connection_init is checked, its context belongs to nobody: a
# principal bound to a project that cannot exist sees nothing and may do nothing.
NOBODY = Principal(uuid.UUID(int=0), TokenScope.READ, uuid.UUID(int=0))


@dataclasses.dataclass(slots=True)
class Context:
    principal: Principal
    services: Services
    loaders: Loaders
    counter: StatementCounter
    request: Any = None
    response: Any = None
    live: Live | None = None
    connection_params: dict[str, Any] | None = None

    @classmethod
    def create(
        cls,
        principal: Principal,
        services: Services,
        request: Any = None,
        response: Any = None,
        counter: StatementCounter | None = None,
        live: Live | None = None,
    ) -> Context:
        counter = counter or StatementCounter()
        return cls(principal, services, Loaders(services.db, counter), counter, request, response, live)

    def fresh(self) -> Context:
        """The same caller with empty loaders: what this context had cached is not reused."""
        return dataclasses.replace(self, loaders=Loaders(self.services.db, self.counter))

    async def project_of(self, table: sa.Table, row: Mapping[Any, Any]) -> uuid.UUID | None:
        """The project an object belongs to (None for global objects such as provider sessions)."""
        if table is t.projects:
            return uuid.UUID(str(row["id"]))
        if table is t.threads or table is t.budgets:
            return uuid.UUID(str(row["project_id"]))
        thread_id = row.get("thread_id")
        if thread_id is None:
            return None
        thread = await self.loaders.rows(t.threads).load(thread_id)
        return None if thread is None else uuid.UUID(str(thread["project_id"]))

    async def visible(self, table: sa.Table, row: Mapping[Any, Any] | None) -> bool:
        if row is None:
            return False
        project_id = await self.project_of(table, row)
        if project_id is None:
            return self.principal.project_id is None
        return self.principal.sees(project_id)

    async def load_visible(self, table: sa.Table, entity_id: uuid.UUID | None) -> Mapping[Any, Any] | None:
        if entity_id is None:
            return None
        row = await self.loaders.rows(table).load(entity_id)
        return row if await self.visible(table, row) else None


def fresh_context(value: Any) -> Any:
    """A fresh copy of a `Context` (other context values pass through).

    Loaders cache rows for the life of their context. Over HTTP that is one request, but a
    WebSocket keeps one context for all its operations and events, so the executor takes
    a fresh copy for every operation and every subscription event: nested fields then
    show the database as it is when the event is resolved, not when the socket first
    asked.
    """
    return value.fresh() if isinstance(value, Context) else value


Info = strawberry.Info[Context, None]
