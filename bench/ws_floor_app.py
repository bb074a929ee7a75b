"""The floor for bench/fanout.py: live fan-out with no framework cost.

A plain Starlette app speaking just enough graphql-transport-ws for the benchmark's
subscribers: `connection_init` -> `connection_ack` (no auth), `subscribe` -> a
`synchronized` item, `ping` -> `pong`, `complete`. `POST /publish {"t": <topic>}` stamps
the time (as Threadloom stamps `occurredAt` before its commit), numbers the event per
topic, encodes the `next` message once per operation id, and writes the same text to
every socket subscribed to the topic, in the request. No GraphQL, no database, no
per-subscription task or queue. Run from the repo root, as bench/fanout.py does:

    python -m uvicorn bench.ws_floor_app:app --ws websockets-sansio --port Q
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from datetime import UTC, datetime

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

PROTOCOL = "graphql-transport-ws"
EVENT_TYPE = "thread.updated"  # what Threadloom's renameThread emits, so the payloads are the same size

# topic -> {(socket id, operation id): (socket, operation id)}; a dict for O(1) removal, in subscribe order.
topics: defaultdict[str, dict[tuple[int, str], tuple[WebSocket, str]]] = defaultdict(dict)
sequences: defaultdict[str, int] = defaultdict(int)


def _next(op: str, item: bytes) -> str:
    """The message Strawberry sends for one subscription item (same keys, same order)."""
    return (
        b'{"id":' + orjson.dumps(op) + b',"type":"next","payload":{"data":{"threadEvents":' + item + b"}}}"
    ).decode()


async def graphql_ws(websocket: WebSocket) -> None:
    await websocket.accept(subprotocol=PROTOCOL)
    mine: dict[tuple[int, str], str] = {}  # key -> topic
    try:
        while True:
            message = orjson.loads(await websocket.receive_text())
            kind = message.get("type")
            if kind == "connection_init":
                await websocket.send_text('{"type":"connection_ack"}')
            elif kind == "subscribe":
                op = str(message["id"])
                topic = str(message["payload"]["variables"]["t"])
                key = (id(websocket), op)
                topics[topic][key] = (websocket, op)
                mine[key] = topic
                item = orjson.dumps({"sequence": sequences[topic], "type": "synchronized", "occurredAt": None})
                await websocket.send_text(_next(op, item))
            elif kind == "ping":
                await websocket.send_text('{"type":"pong"}')
            elif kind == "complete":
                key = (id(websocket), str(message["id"]))
                if key in mine:
                    topics[mine.pop(key)].pop(key, None)
    except WebSocketDisconnect:
        pass
    finally:
        for key, topic in mine.items():
            topics[topic].pop(key, None)


async def publish(request: Request) -> Response:
    occurred_at = datetime.now(UTC).isoformat()
    topic = str(orjson.loads(await request.body())["t"])
    sequences[topic] += 1
    sequence = sequences[topic]
    item = orjson.dumps({"sequence": sequence, "type": EVENT_TYPE, "occurredAt": occurred_at})
    encoded: dict[str, str] = {}
    for websocket, op in list(topics[topic].values()):
        text = encoded.get(op)
        if text is None:
            text = encoded[op] = _next(op, item)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):  # gone: its handler unregisters it
            await websocket.send_text(text)
    return Response(orjson.dumps({"sequence": sequence}), media_type="application/json")


async def readyz(_: Request) -> Response:
    return Response(b"ok", media_type="text/plain")


app = Starlette(
    routes=[
        WebSocketRoute("/graphql", graphql_ws),
        Route("/publish", publish, methods=["POST"]),
        Route("/readyz", readyz),
    ]
)
