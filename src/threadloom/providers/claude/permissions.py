"""What a Claude thread may do: its sandbox settings, and the answer to each permission prompt by runtime mode.

Outside full_access every process gets Claude Code's own sandbox (`sandbox_settings`: bubblewrap
for each Bash command, every folder but the workspace and the toolchain hidden, writes only in
the workspace, no network; it needs `bwrap` and `socat`, and refuses to start without them).
workspace_write adds `--permission-mode acceptEdits` and answers every prompt itself: sandboxed
commands and file tools inside the workspace are allowed, file tools outside it (they run in the
claude process, not in the sandbox) and other tools (web, MCP) are refused with a warning.
approval_required turns each prompt into an approval; read_only allows reading tools inside the
workspace only. `--setting-sources user` keeps a workspace's `.claude/settings.json` (whose hooks
would run unsandboxed) out.

Prompts arrive as `control_request/can_use_tool` (with `tool_use_id`) and are answered with
`control_response` allow (`updatedInput`) or deny (`message`). In the default permission mode
Claude Code itself lets read-only commands (e.g. a plain `echo`, Read) run without asking.
AskUserQuestion asks through `can_use_tool`; the answers go back as `updatedInput.answers`
{question text: label, multi-select labels comma-separated} (sdk-tools.d.ts
`AskUserQuestionInput.answers`; observed to work).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any, Literal

from threadloom.providers.claude.events import FILE_TOOLS, SUBAGENT_TOOLS, TASK_LIST_TOOLS
from threadloom.providers.contract import ProviderError

READ_ONLY_TOOLS = frozenset(
    {"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite", "TaskCreate", "TaskUpdate", "TaskGet", "TaskList"}
)
# Tools a workspace_write thread runs without asking (paths checked); anything else (web, MCP) is refused.
WORKSPACE_TOOLS = frozenset(
    {"Bash", "BashOutput", "KillShell", "KillBash", *FILE_TOOLS, *READ_ONLY_TOOLS, *SUBAGENT_TOOLS, *TASK_LIST_TOOLS}
)
PATH_KEYS = ("file_path", "notebook_path", "path")
# What sandboxed commands may read besides the workspace: the system's programs, libraries and config.
TOOLCHAIN_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")


def permission_mode(mode: str) -> str:
    """Claude Code's `--permission-mode` for a runtime mode."""
    return "acceptEdits" if mode == "workspace_write" else "default"


def sandbox_settings(mode: str, cwd: str) -> dict[str, Any] | None:
    """Claude Code's `--settings` for a thread: its bubblewrap sandbox, except in full_access.

    Every Bash command then runs in bubblewrap with the whole filesystem hidden (`denyRead: /`)
    except the workspace and the toolchain folders, writes only to the workspace, and no network
    (no domain is allowed). `failIfUnavailable` makes a missing bwrap or socat a startup error
    instead of unsandboxed commands. workspace_write lets sandboxed commands run unasked.
    """
    if mode == "full_access":
        return None
    readable = [cwd, os.path.realpath(cwd), *(d for d in TOOLCHAIN_DIRS if os.path.isdir(d))]
    return {
        "sandbox": {
            "enabled": True,
            "failIfUnavailable": True,
            "allowUnsandboxedCommands": False,
            "autoAllowBashIfSandboxed": mode == "workspace_write",
            "filesystem": {"denyRead": ["/"], "allowRead": list(dict.fromkeys(readable))},
        }
    }


def outside_path(tool_input: dict[str, Any], cwd: str) -> str | None:
    """The path a file tool names if it leads outside the workspace (symlinks followed), else None.

    File tools run in the claude process itself, not in the sandbox, so the driver checks them.
    """
    root = os.path.realpath(cwd)
    for key in PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            target = os.path.realpath(os.path.join(cwd, value))
            if target != root and not target.startswith(root + os.sep):
                return value
    return None


def session_key(tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
    """What "accept for the session" remembers: the tool and its command or file."""
    return (tool, str(tool_input.get("command") or tool_input.get("file_path") or ""))


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with a prompt: `allow` it unasked; `refuse` it (`why`, also shown as a `runtime.warning`);
    or `ask` the user (a request of `kind` with `payload`, and `questions` for structured questions)."""

    action: Literal["allow", "refuse", "ask"]
    why: str = ""
    kind: str = ""
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    questions: list[dict[str, Any]] = dataclasses.field(default_factory=list)


ALLOW = Verdict("allow")


def _refuse(why: str) -> Verdict:
    return Verdict("refuse", why=why)


def _questions(tool_input: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"q{i}",
            "question": str(q.get("question")),
            "header": q.get("header"),
            "multiSelect": bool(q.get("multiSelect")),
            "options": [
                {"label": str(o.get("label")), "description": o.get("description")} for o in q.get("options") or []
            ],
        }
        for i, q in enumerate(tool_input.get("questions") or [])
    ]


async def judge(
    tool: str,
    tool_input: dict[str, Any],
    *,
    mode: str,
    cwd: str,
    allowed: set[tuple[str, str]],
    description: Any = None,
) -> Verdict:
    """What to do with a `can_use_tool` prompt in a thread of runtime mode `mode`."""
    if tool == "AskUserQuestion":
        questions = _questions(tool_input)
        return Verdict("ask", kind="user_input", payload={"questions": questions}, questions=questions)
    if mode == "full_access" or session_key(tool, tool_input) in allowed:
        return ALLOW
    if mode in ("workspace_write", "read_only"):
        outside = await asyncio.to_thread(outside_path, tool_input, cwd)
        if outside is not None:
            return _refuse(f"{tool} of {outside}: outside the workspace")
    if mode == "workspace_write":
        return ALLOW if tool in WORKSPACE_TOOLS else _refuse(f"{tool} is not allowed in workspace_write")
    if mode == "read_only":
        return ALLOW if tool in READ_ONLY_TOOLS else _refuse(f"{tool} is not allowed: this thread is read-only")
    kind = "command_approval" if tool == "Bash" else "file_change_approval" if tool in FILE_TOOLS else "permission"
    payload: dict[str, Any] = {"tool": tool, "input": tool_input, "reason": description}
    if tool == "Bash":
        payload["command"] = str(tool_input.get("command", ""))
    elif tool in FILE_TOOLS:
        payload["path"] = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
    return Verdict("ask", kind=kind, payload=payload)


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """The control response to a user's answer, and what else it means for the thread."""

    answer: dict[str, Any]
    remember: tuple[str, str] | None = None  # accepted for the session
    declined: bool = False  # the tool call did not run because the user said no


def reply_to_questions(questions: list[dict[str, Any]], tool_input: dict[str, Any], response: dict[str, Any]) -> Reply:
    """AskUserQuestion answered: {question text: labels}, or a deny if nothing was answered."""
    given = response.get("answers") or {}
    answers: dict[str, str] = {}
    for question in questions:
        labels = (given.get(question["id"]) or {}).get("answers") or []
        if labels:
            answers[question["question"]] = ", ".join(str(label) for label in labels)
    if not answers:
        return Reply({"behavior": "deny", "message": "the user did not answer"})
    return Reply({"behavior": "allow", "updatedInput": {**tool_input, "answers": answers}})


def reply_to_approval(tool: str, tool_input: dict[str, Any], response: dict[str, Any]) -> Reply:
    """An approval decided: accept (for once or the session), decline, or cancel (deny; the caller interrupts)."""
    decision = response.get("decision")
    if decision in ("accept", "acceptForSession"):
        remember = session_key(tool, tool_input) if decision == "acceptForSession" else None
        return Reply({"behavior": "allow", "updatedInput": tool_input}, remember=remember)
    if decision == "cancel":
        answer = {"behavior": "deny", "message": "cancelled by the user", "interrupt": True}
        return Reply(answer, declined=True)
    if decision == "decline":
        return Reply({"behavior": "deny", "message": "declined by the user"}, declined=True)
    raise ProviderError("invalid_response", f"unknown decision {decision!r}")
