"""`session/list`: the threads this token sees, as sessions, a page at a time.

With `cwd`, the threads of the project a `session/new` at `cwd` would use; without it, of every project the
token sees (or of `--project`), project after project. The cursor is opaque to the editor: the project it
is at and the thread page's cursor there.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from threadloom.acp import documents as q
from threadloom.acp.rpc import AcpError, Params
from threadloom.acp.sessions import absolute
from threadloom.agent.wire import INVALID_PARAMS

if TYPE_CHECKING:
    from threadloom.acp.bridge import Bridge


async def list_sessions(bridge: Bridge, params: Params) -> dict[str, Any]:
    cwd = params.get("cwd")
    if cwd is not None or bridge.options.project_id is not None:
        projects = [await bridge.project_for(absolute(cwd) if cwd is not None else "/")]
    else:
        projects = [str(p["id"]) async for p in bridge.api.projects()]
    index, after = _position(params.get("cursor"), projects)
    sessions: list[dict[str, Any]] = []
    while index < len(projects) and not sessions:
        project = (await bridge.api.execute(q.THREADS, {"p": projects[index], "after": after}))["project"]
        page: dict[str, Any] = project["threads"] if project is not None else {"nodes": [], "pageInfo": {}}
        for thread in page["nodes"]:
            info = {"sessionId": thread["id"], "cwd": project["workspaceRoot"], "title": thread["title"]}
            sessions.append({**info, "updatedAt": thread["updatedAt"]})
        if page["pageInfo"].get("hasNextPage"):
            after = page["pageInfo"]["endCursor"]
        else:
            index, after = index + 1, None
    more = index < len(projects)
    return {"sessions": sessions, "nextCursor": _cursor(projects[index], after) if more else None}


def _cursor(project: str, after: str | None) -> str:
    return base64.urlsafe_b64encode(json.dumps([project, after]).encode()).decode()


def _position(cursor: Any, projects: list[str]) -> tuple[int, str | None]:
    if cursor is None:
        return 0, None
    try:
        project, after = json.loads(base64.urlsafe_b64decode(str(cursor).encode()))
        return projects.index(project), after
    except (ValueError, TypeError):
        raise AcpError(INVALID_PARAMS, "not a cursor of session/list", "INVALID_CURSOR") from None
