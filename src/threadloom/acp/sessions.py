"""A session as the bridge holds it, and the checks of what an editor's request names (a cwd, a prompt)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from threadloom.acp.rpc import AcpError, Params
from threadloom.acp.updates import prompt_text
from threadloom.agent.wire import INVALID_PARAMS


@dataclasses.dataclass(slots=True)
class Session:
    """A thread the editor opened through this bridge (new, loaded, resumed or forked)."""

    thread_id: str
    run_id: str | None = None  # the running prompt's run
    prompting: bool = False
    cancel_requested: bool = False  # session/cancel while this prompt runs (its run may not be known yet)
    followed: dict[str, bool] = dataclasses.field(default_factory=dict)  # runs followed → cancelled by the editor
    shown: tuple[str, str | None] | None = None  # the (mode, model) the editor was last shown
    lease: asyncio.Task[None] | None = None  # renews the thread's writer lease while the session drives it


def text_of(params: Params) -> str:
    """The user message of a request's `prompt` (content blocks); INVALID_PROMPT when it cannot be one."""
    try:
        return prompt_text(params.get("prompt") or [])
    except ValueError as exc:
        raise AcpError(INVALID_PARAMS, str(exc), "INVALID_PROMPT") from exc


def absolute(cwd: Any) -> str:
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise AcpError(INVALID_PARAMS, "cwd must be an absolute path", "INVALID_CWD")
    return os.path.normpath(cwd)
