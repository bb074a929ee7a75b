"""Pure rules behind what the dashboard shows: the title a first message gives a thread, and the words an
answered request leaves in the activity list. No database, no server (the browser tests show them served)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from threadloom.domain import projects, threads
from threadloom.domain.dispatch import AppliedDispatch, new_run
from threadloom.domain.entities import AppThread, Project, RuntimeRequest
from threadloom.domain.ids import new_id
from threadloom.domain.requests import resolution_summary
from threadloom.domain.statuses import ResponseCapability, RuntimeRequestKind, RuntimeRequestStatus
from threadloom.domain.threads import DEFAULT_TITLE, ThreadState, first_message_title

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _thread(title: str | None) -> AppThread:
    project: Project = projects.create_project(new_id(), "Demo", "/srv/demo", NOW).entity  # type: ignore[assignment]
    change = threads.create_thread(
        thread_id=new_id(),
        project=project,
        title=title,
        provider_instance_id="scripted",
        model=None,
        runtime_mode="workspace_write",
        now=NOW,
    )
    return change.entity  # type: ignore[return-value]


def test_a_thread_without_a_title_is_named_by_its_first_message() -> None:
    untitled = _thread(None)
    assert untitled.title == DEFAULT_TITLE
    assert first_message_title(untitled, 0, "  Fix the flaky\nlogin test  ") == "Fix the flaky login test"


def test_a_chosen_title_or_a_later_message_keeps_the_title() -> None:
    assert first_message_title(_thread("Release notes"), 0, "write them") is None
    assert first_message_title(_thread(None), 1, "a second message") is None  # the thread already had a run


def test_a_long_first_message_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "Please refactor the authentication middleware so that expired sessions are refreshed transparently"
    title = first_message_title(_thread(None), 0, text)
    assert title is not None and title.endswith("…") and len(title) <= threads.FIRST_MESSAGE_TITLE
    assert text.startswith(title[:-1]) and text[len(title) - 1] == " ", title  # cut between words


def test_the_first_run_writes_the_new_title_and_a_later_one_does_not() -> None:
    thread = _thread(None)
    first = new_run(
        ThreadState(thread, None, [], 0), applied=AppliedDispatch.START_IMMEDIATELY, text="Add a favicon",
        now=NOW, new_id=new_id,
    )
    titles = [c.entity.title for c in first.changes if isinstance(c.entity, AppThread)]
    assert titles and set(titles) == {"Add a favicon"}, titles
    queued = new_run(
        ThreadState(thread.evolve(title="Add a favicon"), None, [], 1), applied=AppliedDispatch.QUEUE_AFTER_ACTIVE,
        text="and a manifest", now=NOW, new_id=new_id,
    )
    assert not [c for c in queued.changes if isinstance(c.entity, AppThread)]


def _request(kind: Any, payload: dict[str, Any]) -> RuntimeRequest:
    return RuntimeRequest(
        id=new_id(), thread_id=new_id(), run_id=new_id(), node_id=new_id(), created_at=NOW, kind=kind,
        status=RuntimeRequestStatus.PENDING, response_capability=ResponseCapability.LIVE, payload=payload,
    )


def test_an_answered_approval_reads_as_words() -> None:
    command = _request(RuntimeRequestKind.COMMAND_APPROVAL, {"command": "npm test"})
    assert resolution_summary(command, {"decision": "accept"}) == "Approved: npm test"
    assert resolution_summary(command, {"decision": "accept_for_session"}) == "Approved for the session: npm test"
    assert resolution_summary(command, {"decision": "decline"}) == "Declined: npm test"
    bare = _request(RuntimeRequestKind.PERMISSION, {})
    assert resolution_summary(bare, {"decision": "cancel"}) == "Cancelled (permission)"


def test_an_answered_question_names_the_question_and_the_answer() -> None:
    question = _request(RuntimeRequestKind.USER_INPUT, {"questions": [{"id": "db", "question": "Which database?"}]})
    summary = resolution_summary(question, {"answers": {"db": ["sqlite"]}})
    assert summary == "Answered: Which database? → sqlite"
    assert "{" not in summary
