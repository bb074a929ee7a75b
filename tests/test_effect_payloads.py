"""The outbox's stored payloads: every effect class encodes to the JSON keys the outbox has always held,
and rows written before the classes existed (older shapes included) decode. Pure: no database."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from threadloom.domain.effects import (
    DeliverToParent,
    EffectData,
    EnsureThread,
    InterruptTurn,
    RespondToRequest,
    StartTurn,
    SteerTurn,
    StopSession,
    StopTasks,
)

A, B, C = (str(uuid.UUID(int=n)) for n in (1, 2, 3))

# (class, a payload as stored by the code before typed effects, the kind, replay safety)
STORED: list[tuple[type[EffectData], dict[str, Any], str, bool]] = [
    (StartTurn, {"runId": A, "attemptId": B}, "provider-turn.start", False),
    (StartTurn, {"runId": A, "attemptId": B, "input": "old\n\nnew"}, "provider-turn.start", False),
    (StartTurn, {"runId": A, "attemptId": B, "threadId": C}, "provider-turn.start", False),
    (EnsureThread, {"threadId": A}, "provider-thread.ensure", True),
    (SteerTurn, {"runId": A, "attemptId": B, "messageId": C}, "provider-turn.steer", False),
    (InterruptTurn, {"runId": A, "attemptId": B}, "provider-turn.interrupt", False),
    (StopSession, {"instance": "codex", "projectId": A, "attemptId": B}, "provider-session.stop", True),
    (StopTasks, {"threadId": A}, "delegated-tasks.stop", True),
    (
        RespondToRequest,
        {"requestId": A, "runId": B, "attemptId": C, "nativeRef": "7", "response": {"decision": "accept"}},
        "runtime-request.respond",
        False,
    ),
    (DeliverToParent, {"parentThreadId": A, "childThreadId": B, "runId": C}, "subagent.deliver", True),
]


@pytest.mark.parametrize(("cls", "stored", "kind", "replay_safe"), STORED)
def test_a_stored_payload_decodes_and_encodes_back_to_the_same_keys(
    cls: type[EffectData], stored: dict[str, Any], kind: str, replay_safe: bool
) -> None:
    effect = cls.decode(stored)
    envelope = effect.envelope()
    assert (envelope.kind, envelope.replay_safe, envelope.payload) == (kind, replay_safe, stored)


def test_ids_decode_as_uuids() -> None:
    effect = SteerTurn.decode({"runId": A, "attemptId": B, "messageId": C})
    assert (effect.run_id, effect.attempt_id, effect.message_id) == tuple(uuid.UUID(x) for x in (A, B, C))


def test_older_rows_decode_with_their_missing_or_null_fields_as_none() -> None:
    """Stop effects queued before turns were named carry only the instance; a request without a native
    ref was stored with `nativeRef: null`."""
    assert StopSession.decode({"instance": "codex"}) == StopSession(instance="codex")
    old: dict[str, Any] = {"requestId": A, "runId": B, "attemptId": C, "nativeRef": None, "response": {}}
    assert RespondToRequest.decode(old).native_ref is None
