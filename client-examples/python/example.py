"""The client walk-through, once with the sync client (HTTP multipart) and once with the async one (WebSocket).

Each pass: create a thread, send a message, stream the run live to its end, disconnect, let a second
run happen unseen, resume from the last cursor and check the replay is exactly the missed events,
then answer an approval the agent asks for. Exits 0 only if every step worked.

Environment: THREADLOOM_URL (the server's base URL, default http://127.0.0.1:8000; /graphql is appended),
THREADLOOM_TOKEN, and
THREADLOOM_PROJECT_ID (else a project is created in a fresh temporary folder; that needs an
all-projects admin token).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time

from threadloom_client import TERMINAL, AsyncClient, Client, ThreadEvent

URL = os.environ.get("THREADLOOM_URL", "http://127.0.0.1:8000").rstrip("/") + "/graphql"


def step(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def exactly_missed(replay: list[ThreadEvent], last: int, latest: int) -> None:
    """The replay after `last` is every event from last+1 on, in order, none twice, none left out."""
    sequences = [e.sequence for e in replay]
    check(sequences == list(range(last + 1, last + 1 + len(sequences))), f"gap or repeat in {sequences}")
    check(bool(sequences) and sequences[-1] >= latest, f"replay {sequences} stops before {latest}")


def sync_pass(token: str, project_id: str) -> None:
    client = Client(URL, token)
    try:
        thread = client.create_thread(project_id, "python sync example")
        step(f"sync: thread {thread.id}")
        events = client.thread_events(thread.id, after=0)
        last = 0
        run = None
        for event in events:  # replay (empty), `synchronized`, then live
            if event.synchronized and run is None:
                run = client.send_message(thread.id, "@reply Hello from the sync client")
                step(f"sync: run {run.id} started; streaming it over HTTP multipart")
                continue
            last = event.sequence
            if event.entity_type == "ConversationMessage" and not event.entity.get("streaming"):
                step(f"sync:   {event.entity['role']}: {event.entity['text']}")
            if run is not None and event.run_status(run.id) in TERMINAL:
                check(event.run_status(run.id) == "COMPLETED", f"run ended {event.run_status(run.id)}")
                break
        events.close()  # disconnect
        step(f"sync: disconnected at sequence {last}")

        missed_run = client.send_message(thread.id, "@reply Sent while you were away")
        while client.run(missed_run.id).status not in TERMINAL:
            time.sleep(0.1)
        latest = client.thread(thread.id).latest_sequence
        replay: list[ThreadEvent] = []
        approval_run = None
        events = client.thread_events(thread.id, after=last)
        for event in events:
            if event.synchronized and approval_run is None:
                exactly_missed(replay, last, latest)
                step(f"sync: resumed after {last}: {len(replay)} missed events, then live")
                approval_run = client.send_message(thread.id, "@approval echo approved\n@reply Approved and done")
                continue
            if approval_run is None:
                replay.append(event)
                continue
            if event.entity_type == "RuntimeRequest" and event.entity["requestStatus"] == "PENDING":
                request = next(r for r in client.pending_requests(thread.id) if r.id == event.entity["id"])
                step(f"sync: approval asked for `{request.command}`; accepting")
                check(client.respond_to_approval(request.id, accept=True) == "RESOLVED", "approval not resolved")
            status = event.run_status(approval_run.id)
            if status in TERMINAL:
                check(status == "COMPLETED", f"approval run ended {status}")
                step("sync: approval run completed")
                break
        events.close()
    finally:
        client.close()


async def async_pass(token: str, project_id: str) -> None:
    client = AsyncClient(URL, token)
    try:
        thread = await client.create_thread(project_id, "python async example")
        step(f"async: thread {thread.id}")
        last = 0
        run = None
        async with contextlib.aclosing(client.thread_events(thread.id, after=0)) as events:
            async for event in events:
                if event.synchronized and run is None:
                    run = await client.send_message(thread.id, "@reply Hello from the async client")
                    step(f"async: run {run.id} started; streaming it over a WebSocket")
                    continue
                last = event.sequence
                if event.entity_type == "ConversationMessage" and not event.entity.get("streaming"):
                    step(f"async:   {event.entity['role']}: {event.entity['text']}")
                if run is not None and event.run_status(run.id) in TERMINAL:
                    check(event.run_status(run.id) == "COMPLETED", "run did not complete")
                    break
        step(f"async: disconnected at sequence {last}")

        missed_run = await client.send_message(thread.id, "@reply Sent while you were away")
        while (await client.run(missed_run.id)).status not in TERMINAL:  # noqa: ASYNC110 - polling a server
            await asyncio.sleep(0.1)
        latest = (await client.thread(thread.id)).latest_sequence
        replay: list[ThreadEvent] = []
        approval_run = None
        async with contextlib.aclosing(client.thread_events(thread.id, after=last)) as events:
            async for event in events:
                if event.synchronized and approval_run is None:
                    exactly_missed(replay, last, latest)
                    step(f"async: resumed after {last}: {len(replay)} missed events, then live")
                    approval_run = await client.send_message(thread.id, "@approval echo approved\n@reply Approved")
                    continue
                if approval_run is None:
                    replay.append(event)
                    continue
                if event.entity_type == "RuntimeRequest" and event.entity["requestStatus"] == "PENDING":
                    step("async: approval asked; accepting")
                    answered = await client.respond_to_approval(event.entity["id"], accept=True)
                    check(answered == "RESOLVED", "approval not resolved")
                status = event.run_status(approval_run.id)
                if status in TERMINAL:
                    check(status == "COMPLETED", f"approval run ended {status}")
                    step("async: approval run completed")
                    break
    finally:
        await client.close()


def main() -> int:
    token = os.environ.get("THREADLOOM_TOKEN")
    if not token:
        print("set THREADLOOM_TOKEN (the token `threadloom serve` printed)", file=sys.stderr)
        return 2
    project_id = os.environ.get("THREADLOOM_PROJECT_ID")
    folder = None  # the project this example made, in a folder it made: both go when it ends
    if not project_id:
        folder = tempfile.mkdtemp(prefix="threadloom-example-")
        with contextlib.closing(Client(URL, token)) as sync:
            project_id = sync.create_project("python example", folder)
        step(f"created project {project_id}")
    try:
        sync_pass(token, project_id)
        asyncio.run(async_pass(token, project_id))
    except Exception as error:  # a failed step is the example's answer
        print(f"FAILED: {error!r}", file=sys.stderr)
        return 1
    finally:
        if folder is not None:
            clean_up(token, project_id, folder)
    step("every step worked")
    return 0


def clean_up(token: str, project_id: str, folder: str) -> None:
    """Archive the project this example made (it leaves `projects`, refuses runs), then remove its folder."""
    with contextlib.closing(Client(URL, token)) as sync:
        sync.archive_project(project_id)
    shutil.rmtree(folder, ignore_errors=True)
    step(f"archived project {project_id} and removed {folder}")


if __name__ == "__main__":
    raise SystemExit(main())
