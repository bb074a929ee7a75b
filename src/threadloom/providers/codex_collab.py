"""Codex collab agents (`[features] multi_agent_v2`) as subagents of the turn that spawned them.

What Codex 0.171's app-server really sends (measured against the fake model, docs/providers.md):
- The model calls `collaboration.spawn_agent`; the parent's turn gets a `subAgentActivity` item (`kind: started`,
  `id` = the call id, `agentThreadId`, `agentPath` such as `/root/helper`, `model`), started and completed at
  once. No `thread/started` is sent for the agent's thread.
- The agent runs turns on its own thread id: `turn/started` (its `rootTurnId` is the parent's turn), its items
  and deltas, server requests (approvals) and `turn/completed`, all with `threadId` = the agent's thread.
- When the agent's turn ends the parent gets another `subAgentActivity` (`kind: completed`, id
  `subagent-completed-<its turn>`); the model reads the agent's final answer as an `agent_message` input.
- `wait_agent`, `send_message`, `followup_task`, `interrupt_agent`, `list_agents` are `collabAgentToolCall` items
  of the parent (`tool: wait`, ...; `receiverThreadIds` empty for a wait).
- Interrupting the parent's turn leaves the agent running; `turn/interrupt` on the agent's own thread ends its
  turn alone. `thread/revert` on an agent's thread is refused ("direct app-server input is not allowed for
  multi-agent v2 sub-agents"), and after a restart its thread cannot be resumed but through its parent.

So the driver shows an agent the way the engine already knows subagents (as the scripted agent's `@subagent`):
its first turn becomes a `subagent` item of the parent's turn naming the agent's thread (`receiverThreadIds`,
`childTurnId`), started when that turn starts, and the agent's own events are handed on as the parent thread's
events of that child turn (`parent_turn` set), so they land on the run that spawned it. The item ends with the
agent's turn. An agent still running when its parent's turn ends is interrupted (nothing keeps working in the
workspace after its run ended) and its node ends INTERRUPTED; later turns of an agent (a `followup_task`) are not
shown.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from threadloom.providers.contract import (
    ItemCompleted,
    ItemStarted,
    ProviderEvent,
    RuntimeExited,
    TurnCompleted,
    TurnStarted,
)

ACTIVITY = "subAgentActivity"
ItemEnd = Literal["completed", "failed", "interrupted"]
_ENDS: dict[str, ItemEnd] = {"completed": "completed", "failed": "failed", "interrupted": "interrupted"}


@dataclasses.dataclass(slots=True)
class Agent:
    """A collab agent spawned by a parent's turn, and how far its first turn got."""

    parent_thread: str
    parent_turn: str
    item_id: str
    detail: dict[str, Any]
    turn: str | None = None  # its first turn, the one shown as the subagent
    ended: bool = False  # its turn ended (or was ended with its parent's): its later events are not shown
    stop_on_start: bool = False  # ended before its turn started: interrupt that turn when it does

    def started(self) -> list[ProviderEvent]:
        """The subagent item and its child turn, once the agent's first turn has an id."""
        assert self.turn is not None
        detail = {**self.detail, "childTurnId": self.turn}
        title = str(self.detail.get("agentPath") or "collab agent")
        return [
            ItemStarted(self.parent_thread, self.parent_turn, self.item_id, "subagent", title, detail),
            TurnStarted(self.parent_thread, self.turn, self.parent_turn),
        ]

    def completed(self, status: str, error: str | None = None) -> list[ProviderEvent]:
        """The end of its turn, then of the subagent item (the scripted agent's order)."""
        self.ended = True
        end = _ENDS.get(status, "failed")
        detail = {**self.detail, "childTurnId": self.turn}
        item = ItemCompleted(self.parent_thread, self.parent_turn, self.item_id, "subagent", end, None, detail)
        if self.turn is None:  # never ran: its item opens and closes here
            return [*self.started_without_turn(), item]
        return [TurnCompleted(self.parent_thread, self.turn, end, error, self.parent_turn), item]

    def started_without_turn(self) -> list[ProviderEvent]:
        title = str(self.detail.get("agentPath") or "collab agent")
        return [ItemStarted(self.parent_thread, self.parent_turn, self.item_id, "subagent", title, dict(self.detail))]

    def adopt(self, event: ProviderEvent) -> ProviderEvent:
        """One of the agent's own events, as an event of its parent's thread in its child turn."""
        if isinstance(event, TurnStarted | TurnCompleted):
            return dataclasses.replace(event, native_thread=self.parent_thread, parent_turn=self.parent_turn)
        if isinstance(event, RuntimeExited):
            return event
        return dataclasses.replace(event, native_thread=self.parent_thread)


class Collab:
    """The collab agents of one app-server, by their own thread id."""

    def __init__(self) -> None:
        self.agents: dict[str, Agent] = {}
        self.interrupts: list[tuple[str, str]] = []  # (agent thread, its turn) to interrupt natively

    @staticmethod
    def is_activity(item: dict[str, Any]) -> bool:
        return item.get("type") == ACTIVITY

    def activity(self, thread: str, turn: str, item: dict[str, Any], started: bool) -> None:
        """A parent's `subAgentActivity`: a spawn registers the agent; the rest is the agent's own events."""
        child = item.get("agentThreadId")
        if not started or item.get("kind") != "started" or not isinstance(child, str) or child in self.agents:
            return
        detail = {
            "tool": "spawnAgent",
            "senderThreadId": thread,
            "receiverThreadIds": [child],
            "agentPath": item.get("agentPath"),
            "model": item.get("model"),
            "reasoningEffort": item.get("reasoningEffort"),
        }
        self.agents[child] = Agent(thread, turn, str(item.get("id")), detail)

    def live(self, thread: str) -> Agent | None:
        """The agent whose events are shown now: spawned, not ended."""
        agent = self.agents.get(thread)
        return agent if agent is not None and not agent.ended else None

    def turn_started(self, agent: Agent, turn: str) -> list[ProviderEvent] | None:
        """The agent's turn began: its first is the subagent's (None: a later turn, not shown)."""
        if agent.turn is not None:
            return None
        agent.turn = turn
        return agent.started()

    def started_too_late(self, thread: str, turn: str) -> None:
        """A turn of an agent whose parent's turn ended before it started: interrupted at once."""
        agent = self.agents.get(thread)
        if agent is not None and agent.stop_on_start and agent.turn is None:
            agent.turn = turn
            self.interrupts.append((thread, turn))

    def parent_ended(self, thread: str, turn: str) -> list[ProviderEvent]:
        """The parent's turn ended: its agents still running are ended with it (and interrupted natively)."""
        out: list[ProviderEvent] = []
        for child, agent in self.agents.items():
            if agent.ended or agent.parent_thread != thread or agent.parent_turn != turn:
                continue
            if agent.turn is None:
                agent.stop_on_start = True
            else:
                self.interrupts.append((child, agent.turn))
            out += agent.completed("interrupted")
        return out

    def running_children(self, thread: str, turn: str) -> list[tuple[str, str]]:
        """(agent thread, its turn) of the agents of a parent's turn whose turn runs now."""
        return [
            (child, agent.turn)
            for child, agent in self.agents.items()
            if not agent.ended and agent.turn is not None and (agent.parent_thread, agent.parent_turn) == (thread, turn)
        ]

    def take_interrupts(self) -> list[tuple[str, str]]:
        taken, self.interrupts = self.interrupts, []
        return taken
