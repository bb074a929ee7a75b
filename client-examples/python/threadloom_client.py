"""A small typed Threadloom client: queries and mutations over HTTP, subscriptions live.

Two flavours with the same methods:

- `Client` (sync, httpx): subscriptions over HTTP as multipart parts
  (`Accept: multipart/mixed;subscriptionSpec=1.0`) — no WebSocket needed.
- `AsyncClient` (asyncio, httpx + websockets): subscriptions over a WebSocket
  (`graphql-transport-ws`, the token in `connection_init`).

Results are dataclasses, not dicts. A subscription yields `ThreadEvent`s; resume after a
disconnect by passing the last `sequence` you saw as `after`: the server replays exactly the
events you missed, then sends one `synchronized` item, then streams live.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncGenerator, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import websockets

MULTIPART = "multipart/mixed;boundary=graphql;subscriptionSpec=1.0,application/json"

THREAD_EVENTS = """subscription($t: ID!, $after: Int) {
  threadEvents(threadId: $t, afterSequence: $after) {
    sequence type runId
    entity {
      __typename
      ... on Run { id status }
      ... on ConversationMessage { role text streaming }
      ... on RuntimeRequest { id kind requestStatus: status }
    }
  }
}"""


class GraphQLError(Exception):
    """A top-level GraphQL error, or a mutation's userErrors; `code` is the stable error code."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors)
        first = errors[0] if errors else {}
        self.code = (first.get("extensions") or {}).get("code") or first.get("code")


@dataclass(frozen=True)
class Thread:
    id: str
    title: str | None
    latest_sequence: int


@dataclass(frozen=True)
class Run:
    id: str
    status: str


@dataclass(frozen=True)
class PendingRequest:
    id: str
    kind: str
    command: str | None


@dataclass(frozen=True)
class ThreadEvent:
    sequence: int
    type: str
    run_id: str | None
    entity_type: str | None
    entity: dict[str, Any]

    @classmethod
    def parse(cls, item: dict[str, Any]) -> ThreadEvent:
        entity = item.get("entity") or {}
        return cls(item["sequence"], item["type"], item.get("runId"), entity.get("__typename"), entity)

    @property
    def synchronized(self) -> bool:
        return self.type == "synchronized"

    def run_status(self, run_id: str) -> str | None:
        """The run's new status when this event is an update of that run."""
        if self.entity_type == "Run" and self.entity.get("id") == run_id:
            return str(self.entity["status"])
        return None


TERMINAL = {"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"}

CREATE_PROJECT = """mutation($name: String!, $root: String!) {
  createProject(input: {name: $name, workspaceRoot: $root}) { project { id } userErrors { code message } } }"""
ARCHIVE_PROJECT = """mutation($p: ID!) {
  archiveProject(input: {projectId: $p}) { project { id archivedAt } userErrors { code message } } }"""
CREATE_THREAD = """mutation($p: ID!, $title: String) {
  createThread(input: {projectId: $p, title: $title}) {
    thread { id title latestSequence } userErrors { code message } } }"""
SEND = """mutation($t: ID!, $text: String!) {
  sendMessage(input: {threadId: $t, text: $text}) { run { id status } userErrors { code message } } }"""
THREAD = "query($t: ID!) { thread(id: $t) { id title latestSequence } }"
RUN = "query($r: ID!) { run(id: $r) { id status } }"
PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id kind payload } } }"
APPROVE = """mutation($r: ID!, $d: Decision!) {
  respondToApproval(input: {requestId: $r, decision: $d}) { request { id status } userErrors { code message } } }"""


def _data(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("errors"):
        raise GraphQLError(body["errors"])
    return body["data"]  # type: ignore[no-any-return]


def _payload(data: dict[str, Any], field: str) -> dict[str, Any]:
    payload: dict[str, Any] = data[field]
    if payload.get("userErrors"):
        raise GraphQLError(payload["userErrors"])
    return payload


def _multipart_parts(chunks: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON parts of a multipart subscription response; heartbeats (`{}`) are skipped."""
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        while (end := buffer.find("\r\n--graphql")) >= 0:
            part, buffer = buffer[:end], buffer[end + len("\r\n--graphql") :]
            _, _, body = part.partition("\r\n\r\n")
            parsed = json.loads(body) if body.strip() else {}
            if parsed:
                yield parsed


def _event(part: dict[str, Any]) -> ThreadEvent:
    if part.get("errors"):  # a transport error (e.g. the token was revoked): the stream ends
        raise GraphQLError(part["errors"])
    payload = part["payload"]
    return ThreadEvent.parse(_data(payload)["threadEvents"])


class Client:
    """Synchronous client; `thread_events` streams over HTTP (multipart)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=60)

    def close(self) -> None:
        self.http.close()

    def execute(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.http.post(self.url, json={"query": query, "variables": variables or {}})
        if response.status_code >= 400 and "json" not in response.headers.get("content-type", ""):
            response.raise_for_status()
        return _data(response.json())

    def create_project(self, name: str, workspace_root: str) -> str:
        created = _payload(self.execute(CREATE_PROJECT, {"name": name, "root": workspace_root}), "createProject")
        return str(created["project"]["id"])

    def archive_project(self, project_id: str) -> None:
        """Archive a project (admin scope): it leaves `projects` and takes no more runs; nothing is deleted."""
        _payload(self.execute(ARCHIVE_PROJECT, {"p": project_id}), "archiveProject")

    def create_thread(self, project_id: str, title: str) -> Thread:
        t = _payload(self.execute(CREATE_THREAD, {"p": project_id, "title": title}), "createThread")["thread"]
        return Thread(t["id"], t["title"], t["latestSequence"])

    def thread(self, thread_id: str) -> Thread:
        t = self.execute(THREAD, {"t": thread_id})["thread"]
        return Thread(t["id"], t["title"], t["latestSequence"])

    def send_message(self, thread_id: str, text: str) -> Run:
        run = _payload(self.execute(SEND, {"t": thread_id, "text": text}), "sendMessage")["run"]
        return Run(run["id"], run["status"])

    def run(self, run_id: str) -> Run:
        run = self.execute(RUN, {"r": run_id})["run"]
        return Run(run["id"], run["status"])

    def pending_requests(self, thread_id: str) -> list[PendingRequest]:
        found = self.execute(PENDING, {"t": thread_id})["thread"]["pendingRequests"]
        return [PendingRequest(r["id"], r["kind"], (r["payload"] or {}).get("command")) for r in found]

    def respond_to_approval(self, request_id: str, accept: bool) -> str:
        decision = "ACCEPT" if accept else "DECLINE"
        answer = _payload(self.execute(APPROVE, {"r": request_id, "d": decision}), "respondToApproval")
        return str(answer["request"]["status"])

    def thread_events(self, thread_id: str, after: int | None = None) -> Generator[ThreadEvent, None, None]:
        """Replay after `after`, then `synchronized`, then live events; closing the iterator disconnects."""
        body = {"query": THREAD_EVENTS, "variables": {"t": thread_id, "after": after}}
        with self.http.stream("POST", self.url, json=body, headers={"accept": MULTIPART}) as response:
            if response.status_code != 200:
                response.read()
                raise GraphQLError(response.json()["errors"])
            for part in _multipart_parts(response.iter_text()):
                yield _event(part)


class AsyncClient:
    """Asyncio client; `thread_events` streams over a WebSocket (graphql-transport-ws)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.http = httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=60)
        self._ids = itertools.count(1)

    async def close(self) -> None:
        await self.http.aclose()

    async def execute(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.http.post(self.url, json={"query": query, "variables": variables or {}})
        if response.status_code >= 400 and "json" not in response.headers.get("content-type", ""):
            response.raise_for_status()
        return _data(response.json())

    async def create_thread(self, project_id: str, title: str) -> Thread:
        data = await self.execute(CREATE_THREAD, {"p": project_id, "title": title})
        t = _payload(data, "createThread")["thread"]
        return Thread(t["id"], t["title"], t["latestSequence"])

    async def send_message(self, thread_id: str, text: str) -> Run:
        run = _payload(await self.execute(SEND, {"t": thread_id, "text": text}), "sendMessage")["run"]
        return Run(run["id"], run["status"])

    async def run(self, run_id: str) -> Run:
        run = (await self.execute(RUN, {"r": run_id}))["run"]
        return Run(run["id"], run["status"])

    async def thread(self, thread_id: str) -> Thread:
        t = (await self.execute(THREAD, {"t": thread_id}))["thread"]
        return Thread(t["id"], t["title"], t["latestSequence"])

    async def pending_requests(self, thread_id: str) -> list[PendingRequest]:
        found = (await self.execute(PENDING, {"t": thread_id}))["thread"]["pendingRequests"]
        return [PendingRequest(r["id"], r["kind"], (r["payload"] or {}).get("command")) for r in found]

    async def respond_to_approval(self, request_id: str, accept: bool) -> str:
        decision = "ACCEPT" if accept else "DECLINE"
        answer = _payload(await self.execute(APPROVE, {"r": request_id, "d": decision}), "respondToApproval")
        return str(answer["request"]["status"])

    async def thread_events(self, thread_id: str, after: int | None = None) -> AsyncGenerator[ThreadEvent, None]:
        """Replay after `after`, then `synchronized`, then live events; closing the iterator disconnects."""
        ws_url = self.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        async with websockets.connect(ws_url, subprotocols=[websockets.Subprotocol("graphql-transport-ws")]) as ws:
            await ws.send(json.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {self.token}"}}))
            ack = json.loads(await ws.recv())
            if ack.get("type") != "connection_ack":
                raise GraphQLError([{"message": f"connection refused: {ack}"}])
            op = str(next(self._ids))
            variables = {"t": thread_id, "after": after}
            payload = {"query": THREAD_EVENTS, "variables": variables}
            await ws.send(json.dumps({"id": op, "type": "subscribe", "payload": payload}))
            async for raw in ws:
                message = json.loads(raw)
                if message.get("type") == "ping":
                    await ws.send(json.dumps({"type": "pong"}))
                elif message.get("type") == "next":
                    yield _event({"payload": message["payload"]})
                elif message.get("type") == "error":
                    raise GraphQLError(message["payload"])
                elif message.get("type") == "complete":
                    return
