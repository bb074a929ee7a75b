"""Codex collab agents through the codex driver, with the real Codex CLI (`multi_agent_v2`) and the fake model.

The fake model's `SPAWN: <task>` calls `collaboration.spawn_agent` then `collaboration.wait_agent`, the spawned
agent works on <task> in a thread of its own, and the parent answers `child said: <its answer>`. The driver shows
the agent as a `subagent` item of the parent's turn naming the agent's own thread, and hands the agent's events
on as the parent thread's events of a child turn (`codex_collab`).
"""

from __future__ import annotations

from typing import Any

from tests.test_codex_driver import WAIT_S, Codex, codex, of_type, texts  # noqa: F401  (the real app-server)
from threadloom.providers import contract as ev
from threadloom.providers.codex import CodexDriver
from threadloom.providers.codex_events import Translator


def _collab_tools(body: dict[str, Any]) -> list[str]:
    spaces = [t for t in body.get("tools") or [] if t.get("type") == "namespace" and t.get("name") == "collaboration"]
    return sorted(str(tool.get("name")) for space in spaces for tool in space.get("tools") or [])


async def test_a_spawned_collab_agent_is_a_subagent_item_whose_own_turn_streams_on_the_parent_thread(
    codex: Codex,  # noqa: F811
) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("workspace_write"))
    turn, events = await s.turn(thread, "SPAWN: RUN: echo from-the-agent")

    # The generated config offers the collab tools (multi_agent_v2), and the model called spawn_agent in them.
    first = codex.requests()[0]
    assert _collab_tools(first) == [
        "followup_task",
        "interrupt_agent",
        "list_agents",
        "send_message",
        "spawn_agent",
        "wait_agent",
    ]
    [spawn] = [e for e in of_type(events, ev.ItemStarted) if e.kind == "subagent"]
    [agent_thread] = spawn.detail["receiverThreadIds"]
    child_turn = spawn.detail["childTurnId"]
    assert (spawn.native_thread, spawn.native_turn, spawn.title) == (thread, turn, "/root/helper")
    assert spawn.detail["tool"] == "spawnAgent" and agent_thread != thread
    # That thread and turn are the ones the agent's model requests carry (Codex's `client_metadata`).
    agent_requests = [b["client_metadata"] for b in codex.requests() if "NEW_TASK" in str(b["input"])]
    assert {(m["thread_id"], m["turn_id"], m["parent_turn_id"]) for m in agent_requests} == {
        (agent_thread, child_turn, turn)
    }

    # Every event of the agent's turn comes as the parent thread's, in the child turn under the parent's turn.
    child = [e for e in events if getattr(e, "native_turn", None) == child_turn]
    assert all(e.native_thread == thread for e in child)
    started = of_type(child, ev.TurnStarted)
    assert [(e.native_turn, e.parent_turn) for e in started] == [(child_turn, turn)]
    [command] = [e for e in of_type(child, ev.ItemCompleted) if e.kind == "tool_call"]
    assert "from-the-agent" in str(command.detail.get("aggregatedOutput"))
    [answer] = [e for e in of_type(child, ev.ItemCompleted) if e.kind == "assistant_message"]
    assert answer.text is not None and answer.text.startswith("tool said: ") and "from-the-agent" in answer.text
    [ended] = of_type(child, ev.TurnCompleted)
    assert (ended.status, ended.parent_turn) == ("completed", turn)

    # The subagent item ends with the agent's turn, then the parent's answer follows in the parent's turn.
    [done] = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "subagent"]
    assert done.status == "completed" and events.index(done) > events.index(ended)
    waits = [e for e in of_type(events, ev.ItemCompleted) if e.detail.get("tool") == "wait"]
    assert [w.kind for w in waits] == ["tool_call"]  # a wait on the agent is a tool call, not another subagent
    parent_messages = [
        e for e in of_type(events, ev.ItemCompleted) if e.kind == "assistant_message" and e.native_turn == turn
    ]
    assert [m.text for m in parent_messages] == [f"child said: {answer.text}"]
    assert isinstance(events[-1], ev.TurnCompleted) and events[-1].native_turn == turn
    assert events[-1].status == "completed" and events[-1].parent_turn is None
    assert "from-the-agent" in texts(events)


async def test_interrupting_the_parent_turn_interrupts_its_running_collab_agent_first(
    codex: Codex,  # noqa: F811
) -> None:
    """Codex leaves a collab agent running when its parent's turn is interrupted; the driver interrupts it too,
    and the fake model sees the agent's own request cancelled."""
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("workspace_write"))
    turn = await s.runtime.start_turn(thread, "SPAWN: HOLD")
    before = await s.until(lambda e: isinstance(e, ev.TurnStarted) and e.parent_turn == turn)
    child_turn = before[-1].native_turn
    # The agent's model request is held open (its reply: one chunk, then waiting for the test).
    requests = codex.fake.wait_requests("/v1/responses", 3, WAIT_S)  # spawn, wait_agent, the agent's own
    assert any("NEW_TASK" in str(body["input"][-1]) for body in requests)
    await s.runtime.interrupt_turn(thread, turn)
    after = await s.until(lambda e: isinstance(e, ev.TurnCompleted) and e.native_turn == turn)
    events = [*before, *after]

    [agent_end] = [e for e in of_type(events, ev.TurnCompleted) if e.native_turn == child_turn]
    assert (agent_end.native_thread, agent_end.status, agent_end.parent_turn) == (thread, "interrupted", turn)
    [item] = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "subagent"]
    assert item.status == "interrupted"
    assert events[-1].status == "interrupted"  # type: ignore[union-attr]
    assert events.index(agent_end) < len(events) - 1
    # The agent's held model request was really cancelled by the CLI (not only shown as interrupted).
    abandoned = codex.fake.wait_abandoned("/v1/responses", 1, WAIT_S)
    assert ["NEW_TASK" in str(body["input"][-1]) for body in abandoned] == [True]


# ---- what the driver does when a parent's turn ends first (the app-server's own message shapes) --------------

P, T, A, AT = "parent-thread", "parent-turn", "agent-thread", "agent-turn"


def _spawned(kind: str = "started") -> dict[str, Any]:
    item = {"type": "subAgentActivity", "id": "call_1", "kind": kind, "agentThreadId": A, "agentPath": "/root/helper"}
    return {"method": "item/started", "params": {"threadId": P, "turnId": T, "item": item}}


def _turn(method: str, thread: str, turn: str, status: str = "inProgress") -> dict[str, Any]:
    return {"method": method, "params": {"threadId": thread, "turn": {"id": turn, "rootTurnId": T, "status": status}}}


def test_an_agent_still_running_when_its_parents_turn_ends_ends_interrupted_and_is_interrupted_natively() -> None:
    """Codex lets a collab agent run on after its parent's turn (a model that did not wait for it); nothing of a
    run may keep working after the run ended, so the driver ends the agent's node and interrupts its turn."""
    translator = Translator(lambda text: text)
    assert translator.translate(_spawned()) == []
    shown = translator.translate(_turn("turn/started", A, AT))
    assert [type(e).__name__ for e in shown] == ["ItemStarted", "TurnStarted"]
    events = translator.translate(_turn("turn/completed", P, T, "completed"))
    assert [(type(e).__name__, e.native_thread, e.native_turn) for e in events] == [
        ("TurnCompleted", P, AT),
        ("ItemCompleted", P, T),
        ("TurnCompleted", P, T),
    ]
    agent_end, item, parent_end = events
    assert isinstance(agent_end, ev.TurnCompleted) and (agent_end.status, agent_end.parent_turn) == ("interrupted", T)
    assert isinstance(item, ev.ItemCompleted) and (item.kind, item.status) == ("subagent", "interrupted")
    assert isinstance(parent_end, ev.TurnCompleted) and parent_end.parent_turn is None
    assert translator.collab.take_interrupts() == [(A, AT)]
    # What the agent still sends is not shown as the parent's (its thread has no binding: the engine drops it).
    late = translator.translate(_turn("turn/completed", A, AT, "interrupted"))
    assert [e.native_thread for e in late] == [A]


def test_an_agent_whose_turn_had_not_started_when_its_parent_ended_is_interrupted_as_it_starts() -> None:
    translator = Translator(lambda text: text)
    translator.translate(_spawned())
    events = translator.translate(_turn("turn/completed", P, T, "interrupted"))
    assert [(type(e).__name__, getattr(e, "status", None)) for e in events] == [
        ("ItemStarted", None),
        ("ItemCompleted", "interrupted"),
        ("TurnCompleted", "interrupted"),
    ]
    assert translator.collab.take_interrupts() == []
    assert [e.native_thread for e in translator.translate(_turn("turn/started", A, AT))] == [A]  # not shown
    assert translator.collab.take_interrupts() == [(A, AT)]


def test_the_generated_config_offers_collab_agents_unless_the_instance_turns_them_off(tmp_path: Any) -> None:
    on = CodexDriver("c", tmp_path, {}).config_toml()
    off = CodexDriver("c", tmp_path, {"collab_agents": False}).config_toml()
    assert "multi_agent_v2 = true" in on.split("[features]")[1].split("[permissions")[0]
    assert "multi_agent_v2 = false" in off.split("[features]")[1].split("[permissions")[0]
