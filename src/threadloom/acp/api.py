"""The bridge's way to the server: one graphql-transport-ws socket, opened again when it closes, and the
answers of the API turned into ACP errors (a mutation's userError keeps its stable code in `data.code`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from threadloom.acp import documents as q
from threadloom.acp.graphql_socket import GraphQLError, GraphQLSocket
from threadloom.acp.rpc import AUTH_REQUIRED, RESOURCE_NOT_FOUND, AcpError
from threadloom.agent.wire import INTERNAL_ERROR, INVALID_PARAMS

# What a session id that is not a thread this token sees gets, whatever the reason: an id of another
# project's thread is refused exactly as an id that names nothing, so an id says nothing of what exists.
UNKNOWN_SESSION = "no such session for this token"


class Api:
    def __init__(self, url: str, token: str, device: str | None = None) -> None:
        self.url = url
        self.token = token
        self.device = device
        self._socket: GraphQLSocket | None = None
        self._connecting = asyncio.Lock()

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close()

    async def execute(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        socket = await self.connected()
        try:
            return await socket.execute(query, variables)
        except GraphQLError as exc:
            raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc

    async def thread(self, session_id: str) -> dict[str, Any]:
        """The session's thread (`documents.THREAD`) as this token sees it; NOT_FOUND for any other id."""
        try:
            thread = (await self.execute(q.THREAD, {"t": session_id}))["thread"] if session_id else None
        except AcpError as exc:
            if exc.code not in {"INVALID_ID", "NOT_FOUND"}:
                raise
            thread = None  # a malformed id is refused as an unknown one
        if thread is None:
            raise AcpError(RESOURCE_NOT_FOUND, UNKNOWN_SESSION, "NOT_FOUND")
        return thread  # type: ignore[no-any-return]

    async def projects(self) -> AsyncIterator[dict[str, Any]]:
        """Every project the token sees (`id`, `workspaceRoot`), oldest first."""
        cursor: str | None = None
        while True:
            page = (await self.execute(q.PROJECTS, {"after": cursor}))["projects"]
            for project in page["nodes"]:
                yield project
            if not page["pageInfo"]["hasNextPage"]:
                return
            cursor = page["pageInfo"]["endCursor"]

    async def messages(self, thread_id: str) -> AsyncIterator[list[dict[str, Any]]]:
        """The thread's messages, a page at a time."""
        cursor: str | None = None
        while True:
            thread = (await self.execute(q.MESSAGES, {"t": thread_id, "after": cursor}))["thread"]
            if thread is None:
                return
            yield thread["messages"]["nodes"]
            if not thread["messages"]["pageInfo"]["hasNextPage"]:
                return
            cursor = thread["messages"]["pageInfo"]["endCursor"]

    async def runs_newest_first(self, thread_id: str) -> AsyncIterator[dict[str, Any]]:
        """The thread's runs (`id`, `ordinal`, `status`), the newest first."""
        cursor: str | None = None
        while True:
            thread = (await self.execute(q.RUNS, {"t": thread_id, "before": cursor}))["thread"]
            if thread is None:
                return
            for run in reversed(thread["runs"]["nodes"]):
                yield run
            if not thread["runs"]["pageInfo"]["hasPreviousPage"]:
                return
            cursor = thread["runs"]["pageInfo"]["startCursor"]

    async def connected(self, within: float = 0.0) -> GraphQLSocket:
        """The socket to the server, opened again if it closed (retrying up to `within` seconds)."""
        async with self._connecting:
            if self._socket is not None and not self._socket.closed:
                return self._socket
            loop = asyncio.get_running_loop()
            deadline, pause = loop.time() + within, 0.1
            while True:
                try:
                    self._socket = await GraphQLSocket.connect(self.url, self.token, self.device)
                    return self._socket
                except GraphQLError as exc:
                    if exc.code == "UNAUTHENTICATED":
                        raise AcpError(AUTH_REQUIRED, str(exc), exc.code) from exc
                    if loop.time() + pause > deadline:
                        raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc
                await asyncio.sleep(pause)  # backoff between reconnection attempts
                pause = min(pause * 2, 2.0)


def payload(answer: dict[str, Any]) -> dict[str, Any]:
    """A mutation's payload; its first userError becomes the request's error, with its stable code."""
    if answer["userErrors"]:
        error = answer["userErrors"][0]
        raise AcpError(INVALID_PARAMS, str(error["message"]), str(error["code"]))
    return answer
