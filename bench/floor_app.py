"""The floor for bench/query_page.py: the same page of threads with no framework cost.

A plain Starlette app with one route that reads the rows with raw asyncpg (a pool) and
returns them with orjson, in the same shape as the GraphQL `threads` connection (global
ids, cursors, status, pageInfo). It does no auth, no GraphQL parsing or validation, and
runs one statement. Run from the repo root:

    FLOOR_PG_HOST=<socket dir> FLOOR_PG_DB=<db> python -m uvicorn bench.floor_app:app --port Q

`GET /threads?project=<uuid>&first=100`
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# Same rows and order as the GraphQL page: unarchived threads of one project by id,
# one extra row to learn hasNextPage; status is the active run's status, else idle.
PAGE_SQL = """
SELECT t.id, t.title, upper(coalesce(r.status, 'idle')) AS status, t.last_sequence,
       t.provider_instance_id, t.model, t.runtime_mode, t.queue_held, t.archived_at,
       t.created_at, t.updated_at, p.id AS project_id, p.name AS project_name
FROM threads t
JOIN projects p ON p.id = t.project_id
LEFT JOIN runs r ON r.id = t.active_run_id
WHERE t.project_id = $1 AND t.archived_at IS NULL
ORDER BY t.id
LIMIT $2
"""


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _page(rows: list[asyncpg.Record], first: int) -> dict[str, Any]:
    edges = []
    for r in rows[:first]:
        cursor = _b64(f"c:{r['id']}")
        edges.append(
            {
                "cursor": cursor,
                "node": {
                    "id": _b64(f"Thread:{r['id']}"),
                    "title": r["title"],
                    "status": r["status"],
                    "latestSequence": r["last_sequence"],
                    "providerInstanceId": r["provider_instance_id"],
                    "model": r["model"],
                    "runtimeMode": r["runtime_mode"],
                    "queueHeld": r["queue_held"],
                    "archivedAt": r["archived_at"],
                    "createdAt": r["created_at"],
                    "updatedAt": r["updated_at"],
                    "project": {"id": _b64(f"Project:{r['project_id']}"), "name": r["project_name"]},
                },
            }
        )
    page_info = {"hasNextPage": len(rows) > first, "endCursor": edges[-1]["cursor"] if edges else None}
    return {"data": {"threads": {"edges": edges, "pageInfo": page_info}}}


async def threads(request: Request) -> Response:
    project = uuid.UUID(request.query_params["project"])
    first = int(request.query_params.get("first", "100"))
    pool: asyncpg.Pool = request.app.state.pool
    async with pool.acquire() as conn:
        rows = await conn.fetch(PAGE_SQL, project, first + 1)
    return Response(orjson.dumps(_page(rows, first)), media_type="application/json")


async def readyz(_: Request) -> Response:
    return Response(b"ok", media_type="text/plain")


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    pool = await asyncpg.create_pool(
        host=os.environ["FLOOR_PG_HOST"],
        user=os.environ.get("FLOOR_PG_USER", "postgres"),
        database=os.environ["FLOOR_PG_DB"],
        min_size=1,
        max_size=10,
    )
    app.state.pool = pool
    try:
        yield
    finally:
        await pool.close()


app = Starlette(routes=[Route("/threads", threads), Route("/readyz", readyz)], lifespan=lifespan)
