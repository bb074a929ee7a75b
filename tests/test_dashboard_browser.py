"""The dashboard at /dashboard, driven in a real headless Chromium (tests/support/browser.py) by Playwright.

A user opens the page, types the token, sends messages from the page and watches the runs end live,
approves a request with the page's button, and keeps watching across server restarts: the page reconnects
to the same address and resumes by cursor — events that happened while it was away show up, nothing twice.
The screenshot of the end is kept as a test artifact (`test-artifacts/dashboard.png`) and must not be blank.

Playwright's own browser download is not reachable here, so it launches Debian's through its executable path
(`scripts/test` and `.ci/run` install it with apt-get when it is missing).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from tests.support.browser import launched
from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread, workspace
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
SEND = """mutation($t: ID!, $text: String!) {
  sendMessage(input: {threadId: $t, text: $text}) { run { id } userErrors { code message } } }"""
RUN = "query($r: ID!) { run(id: $r) { status } }"
PROJECT_OF = "query($t: ID!) { thread(id: $t) { project { id } } }"
TERMINAL = {"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"}
EVENTS = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type entity { __typename ... on Run { id status } } } }"""

# Distinct colours of a PNG, counted by the browser's own decoder on a blank page (no Pillow needed).
COUNT_COLOURS = """async (data) => {
  const blob = await (await fetch("data:image/png;base64," + data)).blob();
  const bitmap = await createImageBitmap(blob);
  const canvas = new OffscreenCanvas(bitmap.width, bitmap.height);
  const context = canvas.getContext("2d");
  context.drawImage(bitmap, 0, 0);
  const pixels = context.getImageData(0, 0, bitmap.width, bitmap.height).data;
  const seen = new Set();
  for (let i = 0; i < pixels.length; i += 4) seen.add((pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]);
  return {width: bitmap.width, height: bitmap.height, colours: seen.size};
}"""

# Records every status each run element of the page shows, so the test can tell it watched a run change.
WATCH_RUNS = """() => {
  window.seenStatuses = {};
  const note = () => document.querySelectorAll("#runs .run").forEach((run) => {
    const seen = (window.seenStatuses[run.dataset.ordinal] ||= []);
    if (seen.at(-1) !== run.dataset.status) seen.push(run.dataset.status);
  });
  const all = {childList: true, subtree: true, attributes: true};
  new MutationObserver(note).observe(document.getElementById("runs"), all);
}"""


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the module (tests/support/browser.py); each test opens a context of its own."""
    async with launched() as chromium:
        yield chromium


async def send(client: Client, thread_id: str, text: str, device: str | None = None) -> str:
    """`device`: the `Threadloom-Device` to send as: the page's own, on a thread the page drives (its lease)."""
    headers = {} if device is None else {"Threadloom-Device": device}
    data = await client.gql(SEND, {"t": thread_id, "text": text}, headers=headers)
    assert data["sendMessage"]["userErrors"] == [], data
    return str(data["sendMessage"]["run"]["id"])


async def ended(client: Client, run_id: str) -> str:
    """The run's final status, waited for on the thread's event stream (no polling, no sleeps)."""
    ws = await WsClient.connect(client.base_url, client.token)
    try:
        run = (await client.gql(RUN, {"r": run_id}))["run"]
        if run["status"] in TERMINAL:
            return str(run["status"])
        thread = (await client.gql("query($r: ID!) { run(id: $r) { thread { id } } }", {"r": run_id}))["run"]
        await ws.subscribe(EVENTS, {"t": thread["thread"]["id"]})
        async for message in ws.items(within=60):
            assert message["type"] == "next", message
            entity = message["payload"]["data"]["threadEvents"]["entity"] or {}
            if entity.get("id") == run_id and entity.get("status") in TERMINAL:
                return str(entity["status"])
        raise AssertionError("the stream ended")
    finally:
        await ws.close()


async def run_elsewhere(
    database_url: str, data_dir: Path, token: str, thread: str, text: str, device: str | None = None
) -> None:
    """Another server process on the same database runs `text` on the thread to its end, then stops."""
    other = ServerProcess(database_url, data_dir).wait_ready()  # no replay limit: `ended` replays the thread
    away = Client(other.url, token)
    try:
        assert await ended(away, await send(away, thread, text, device)) == "COMPLETED"
    finally:
        await away.aclose()
        other.stop()


async def sign_in(page: Page, url: str, token: str) -> None:
    await page.goto(url + "/dashboard")
    await expect(page.locator("#login")).to_be_visible()
    await page.fill("#token", token)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#connection")).to_have_attribute("data-state", "live")


def thread_subscriptions(frames: list[str]) -> list[dict[str, Any]]:
    """The variables of every `threadEvents` subscribe message the page sent, in order."""
    found = []
    for frame in frames:
        message = json.loads(frame)
        if message.get("type") == "subscribe" and "threadEvents" in message["payload"]["query"]:
            found.append(message["payload"]["variables"])
    return found


def run_card(page: Page, ordinal: int) -> Any:
    return page.locator(f"#runs .run[data-ordinal='{ordinal}']")


async def open_page(browser: Browser) -> tuple[Page, list[str]]:
    """A page of the screenshot's size, collecting its uncaught errors and confirming its dialogs (a rollback asks)."""
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("dialog", lambda dialog: dialog.accept())
    return page, errors


async def thread_page(
    browser: Browser, server: ServerProcess, client: Client, home: str, title: str
) -> tuple[Page, list[str]]:
    """A project on `home`, and a page signed in that created a thread `title` with its form (and opened it)."""
    await make_project(client, title, home)
    page, errors = await open_page(browser)
    assert client.token
    await sign_in(page, server.url, client.token)
    await page.fill("#new-thread-title", title)
    await page.click("#new-thread button[type=submit]")
    await expect(page.locator("#thread-title")).to_have_text(title)
    return page, errors


async def send_from_page(page: Page, text: str, dispatch: str = "auto") -> None:
    """Send with the page's form; it clears the box once the server took the message without userErrors."""
    await page.fill("#message", text)
    await page.select_option("#dispatch", dispatch)
    await page.click("#send button[type=submit]")
    await expect(page.locator("#message")).to_have_value("")
    await expect(page.locator("#error")).to_be_empty()


async def test_the_dashboard_follows_a_thread_live_across_restarts(
    browser: Browser, database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, data_dir).wait_ready()
    port, token = server.port, server.admin_token
    assert token
    api = Client(server.url, token)
    try:
        project = await make_project(api, "Threadloom demo", workspace(tmp_path, "demo"))
        thread = (await make_thread(api, project, "Fix the flaky login test"))["id"]

        # The page and its files need no token (they hold no data); /graphql does.
        async with httpx.AsyncClient(base_url=server.url) as http:
            page_response = await http.get("/dashboard/")
            assert page_response.status_code == 200 and "text/html" in page_response.headers["content-type"]
            assert "script-src 'self'" in page_response.headers["content-security-policy"]
            assert (await http.get("/dashboard/app.js")).status_code == 200
            assert (await http.get("/dashboard/../app.py")).status_code == 404
            assert (await http.post("/graphql", json={"query": "{ viewer { scope } }"})).status_code == 401

        page, errors = await open_page(browser)
        sent_frames: list[str] = []
        page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sent_frames.append(str(frame))))

        await sign_in(page, server.url, token)
        await page.click(f"#threads li[data-id='{thread}']")
        await expect(page.locator("#thread-title")).to_have_text("Fix the flaky login test")
        await page.evaluate(WATCH_RUNS)

        # 1. A message sent from the page; its run ends COMPLETED on the page, live.
        await page.fill("#message", "@reply Found it: the test raced the session cookie.")
        await page.click("#send button[type=submit]")
        await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
        await expect(page.locator("#messages li[data-role=ASSISTANT] .text")).to_have_text(
            ["Found it: the test raced the session cookie."]
        )

        # 2. The agent asks for approval; the page's Approve button answers it and the run goes on.
        await page.fill("#message", "@approval echo patching login_test.py\n@reply Patched and the suite passes.")
        await page.click("#send button[type=submit]")
        request = page.locator("#requests li[data-kind=COMMAND_APPROVAL]")
        await expect(request).to_contain_text("echo patching login_test.py")
        await expect(run_card(page, 2)).to_have_attribute("data-status", "WAITING")
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "dashboard-approval.png"))  # the README's picture
        await request.get_by_role("button", name="Approve", exact=True).click()
        await expect(run_card(page, 2)).to_have_attribute("data-status", "COMPLETED")
        await expect(page.locator("#requests li")).to_have_count(0)
        seen = await page.evaluate("window.seenStatuses")
        assert seen["2"].index("WAITING") < seen["2"].index("COMPLETED"), seen  # watched live, not reloaded
        assert seen["1"][-1] == "COMPLETED", seen

        # 3. The server goes away; while the page cannot reach it, another server process on the same
        # database runs a message the page never saw live.
        server.stop()
        await expect(page.locator("#connection")).to_have_attribute("data-state", re.compile("reconnecting|connecting"))
        last_seen = await page.evaluate("state.t.lastSeq")  # the page's cursor when the server went away
        subscribed_before = len(thread_subscriptions(sent_frames))
        missed = "@reply Also fixed the logout test while you were away."
        device = await page.evaluate("DEVICE")  # the page drives the thread (its lease): this is the same device
        await run_elsewhere(database_url, data_dir, token, thread, missed, device)

        # 4. Back at the same address: the page reconnects, replays what it missed from its cursor, then
        # follows live again.
        server = ServerProcess(database_url, data_dir, port=port).wait_ready()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=30_000)
        await expect(run_card(page, 3)).to_have_attribute("data-status", "COMPLETED")
        await expect(page.locator("#messages")).to_contain_text("Also fixed the logout test while you were away.")
        live = await send(api, thread, "@reply Back live after the restart.", device)
        assert live
        await expect(run_card(page, 4)).to_have_attribute("data-status", "COMPLETED")
        await expect(page.locator("#messages")).to_contain_text("Back live after the restart.")

        # Each message once, each activity once: the replay overlapped nothing the page already had.
        messages = await page.locator("#messages li").evaluate_all("(items) => items.map((li) => li.dataset.id)")
        assert len(messages) == 8 and len(set(messages)) == 8, messages
        user = await page.locator("#messages li[data-role=USER] .text").all_text_contents()
        assert user == [
            "@reply Found it: the test raced the session cookie.",
            "@approval echo patching login_test.py\n@reply Patched and the suite passes.",
            "@reply Also fixed the logout test while you were away.",
            "@reply Back live after the restart.",
        ]
        activities = page.locator("#activities li")
        sequences = await activities.evaluate_all("(items) => items.map((li) => li.dataset.sequence)")
        assert len(sequences) == len(set(sequences)), sequences
        # On the wire: after the reconnect the page subscribed again from exactly where it was.
        resumed = thread_subscriptions(sent_frames)[subscribed_before:]
        assert resumed == [{"t": thread, "after": last_seen}], resumed
        assert errors == [], errors
        await expect(page.locator("#error")).to_be_empty()  # the replay's thread snapshots resolved cleanly

        # The screenshot, kept as an artifact, is a real picture: many colours, the page's size.
        await expect(page.locator("#requests li")).to_have_count(0)
        shot = tmp_path / "dashboard.png"
        await page.screenshot(path=str(shot), full_page=True)
        shutil.copy2(shot, ARTIFACTS / "dashboard.png")
        blank = await browser.new_page()
        measured = await blank.evaluate(COUNT_COLOURS, base64.b64encode(shot.read_bytes()).decode())
        await blank.close()
        assert measured["width"] == 1280 and measured["height"] >= 900, measured
        assert measured["colours"] > 50, measured
        await page.close()
    finally:
        await api.aclose()
        server.stop()
        print(server.report(60))


async def test_a_token_of_another_project_sees_nothing_of_this_one(
    browser: Browser, server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    ours = await make_project(client, "Ours", workspace(tmp_path, "ours"))
    theirs = await make_project(client, "Theirs", workspace(tmp_path, "theirs"))
    secret = (await make_thread(client, ours, "<b>secret</b> plans"))["id"]
    await send(client, secret, "@reply the secret")
    _, their_token = create_token(database_url, "operate", theirs)

    # The API answers their token with nothing of ours: no thread, no project, no events.
    outsider = Client(server.url, their_token)
    try:
        assert (await outsider.gql("query($t: ID!) { thread(id: $t) { id } }", {"t": secret}))["thread"] is None
        assert (await outsider.gql("query($p: ID!) { project(id: $p) { id } }", {"p": ours}))["project"] is None
        listed = await outsider.gql("{ projects(first: 100) { nodes { id } } }")
        assert [p["id"] for p in listed["projects"]["nodes"]] == [theirs]
        ws = await WsClient.connect(server.url, their_token)
        try:
            await ws.subscribe(EVENTS, {"t": secret})
            refused = await ws.receive()
            assert refused["type"] in ("error", "next"), refused
            errors = refused["payload"] if refused["type"] == "error" else refused["payload"]["errors"]
            assert [e["extensions"]["code"] for e in errors] == ["NOT_FOUND"], refused
        finally:
            await ws.close()
    finally:
        await outsider.aclose()

    # The page signed in with their token shows their project only, and none of our threads.
    page = await browser.new_page()
    await sign_in(page, server.url, their_token)
    await expect(page.locator("#project option")).to_have_text(["Theirs"])
    await expect(page.locator("#threads li")).to_have_count(0)
    await page.close()

    # With our token the hostile-looking title is shown as text, never as markup.
    page = await browser.new_page()
    assert client.token
    await sign_in(page, server.url, client.token)
    await page.select_option("#project", ours)
    title = page.locator(f"#threads li[data-id='{secret}'] .title")
    await expect(title).to_have_text("<b>secret</b> plans")
    assert await page.locator("#threads b").count() == 0
    await page.close()

    # A wrong token is refused on the page and not kept.
    page = await browser.new_page()
    await page.goto(server.url + "/dashboard")
    await page.fill("#token", "tl_not_a_real_token")
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#login-error")).to_have_text("The server refused this token.")
    assert await page.evaluate("sessionStorage.getItem('threadloom.token')") is None
    await page.close()


async def test_a_replayed_thread_snapshot_whose_run_has_ended_reads_idle(client: Client, tmp_path: Path) -> None:
    """The dashboard replays a thread's events after a restart; a `thread.updated` snapshot of a run's start
    names that run as active, and the run, read now, is over. That used to be an internal error at
    `entity.status` (the dashboard showed it); the thread is idle now."""
    project = await make_project(client, "Replay", workspace(tmp_path, "replay"))
    thread = (await make_thread(client, project, "replayed"))["id"]
    assert await ended(client, await send(client, thread, "@reply one")) == "COMPLETED"
    ws = await WsClient.connect(client.base_url, client.token)
    try:
        query = """subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) {
          sequence type entity { __typename ... on Thread { status } } } }"""
        await ws.subscribe(query, {"t": thread})
        statuses = []
        async for message in ws.items():
            assert message["type"] == "next", message
            assert "errors" not in message["payload"], message
            event = message["payload"]["data"]["threadEvents"]
            if event["type"] == "synchronized":
                break
            if (event["entity"] or {}).get("__typename") == "Thread":
                statuses.append(event["entity"]["status"])
        assert statuses and set(statuses) == {"IDLE"}, statuses
    finally:
        await ws.close()


async def test_the_page_manages_the_queue_stops_answers_forks_and_rolls_back(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    page, errors = await thread_page(browser, server, client, workspace(tmp_path, "controls"), "Queue and controls")
    await expect(page.locator("#threads li")).to_have_text([re.compile("Queue and controls")])
    queue = page.locator("#queue li")

    # A run held open by an approval, two messages queued behind it.
    await send_from_page(page, "@approval true\n@reply held run done")
    await expect(run_card(page, 1)).to_have_attribute("data-status", "WAITING")
    await send_from_page(page, "@reply first queued", "queueAfterActive")
    await send_from_page(page, "@reply second queued", "queueAfterActive")
    await expect(queue).to_have_text([re.compile("first queued"), re.compile("second queued")])

    # Reorder with the page's arrows, cancel with its button.
    await queue.nth(0).get_by_role("button", name="Move down").click()
    await expect(queue).to_have_text([re.compile("second queued"), re.compile("first queued")])
    await queue.nth(1).get_by_role("button", name="Cancel").click()
    await expect(queue).to_have_text([re.compile("second queued")])
    await expect(run_card(page, 2)).to_have_attribute("data-status", "CANCELLED")

    # Stop: the active run ends, the queue is held; Resume queue starts what is left.
    await page.click("#stop")
    await expect(run_card(page, 1)).to_have_attribute("data-status", re.compile("INTERRUPTED|CANCELLED"))
    await expect(page.locator("#queue-held")).to_contain_text("queue held")
    await expect(page.locator("#requests li")).to_have_count(0)
    await page.click("#resume-queue")
    await expect(run_card(page, 3)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#resume-queue")).to_be_hidden()

    # A question answered with the page's form.
    await send_from_page(page, "@ask Which database? | postgres | sqlite")
    question = page.locator("#requests li[data-kind=USER_INPUT]")
    await expect(question).to_contain_text("Which database?")
    await question.locator("select").select_option("sqlite")
    await question.get_by_role("button", name="Answer").click()
    await expect(run_card(page, 4)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#messages li[data-role=ASSISTANT]").last).to_contain_text("sqlite")

    # Roll back to right after run 3 from its checkpoint: run 4 is rolled back, live.
    checkpoint = page.locator("#checkpoints li", has_text="after run 3")
    await checkpoint.get_by_role("button", name="Roll back here").click()
    await expect(run_card(page, 4)).to_have_attribute("data-status", "ROLLED_BACK")
    # Undo it from the page: run 4 is back, and the button goes away with the rolled-back runs.
    await page.click("#undo-rollback")
    await expect(run_card(page, 4)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#undo-rollback")).to_be_hidden()
    await expect(page.locator("#messages li[data-role=ASSISTANT]").last).to_contain_text("sqlite")

    # Fork from run 3: the page opens the fork, which links back to its source. Events re-render the page at
    # any moment; one between the press and the release of the click must not lose it (it did in CI: the
    # release landed on a new button, so the browser clicked neither).
    box = await run_card(page, 3).get_by_role("button", name="Fork").bounding_box()
    assert box is not None
    await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    await page.mouse.down()
    await page.evaluate("render()")
    await page.mouse.up()
    await expect(page.locator("#thread-title")).to_have_text("Fork of Queue and controls")
    await expect(page.locator("#lineage")).to_contain_text("Queue and controls")
    await expect(page.locator("#threads li")).to_have_count(2)
    await page.locator("#lineage a").click()
    await expect(page.locator("#forks li")).to_have_text([re.compile("Fork of Queue and controls")])
    assert errors == [], errors
    await page.close()


REQUESTS = "query($r: ID!) { run(id: $r) { attempts { attemptOrdinal status reason } } }"
ANSWERED = "query($id: ID!) { node(id: $id) { ... on RuntimeRequest { status response } } }"


async def test_the_page_restarts_steers_and_approves_for_the_session(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    page, errors = await thread_page(browser, server, client, workspace(tmp_path, "steering"), "Steer from the page")
    approval = page.locator("#requests li[data-kind=COMMAND_APPROVAL]")

    # Restart: the held run's turn is interrupted and tried again with both messages, as attempt 2 of run 1.
    await send_from_page(page, "@approval true\n@reply first answer")
    await expect(run_card(page, 1)).to_have_attribute("data-status", "WAITING")
    await send_from_page(page, "@reply restarted with this", "restartActive")
    await expect(run_card(page, 1).locator(".attempts")).to_contain_text("attempt 2")
    await expect(run_card(page, 1)).to_have_attribute("data-status", "WAITING")  # attempt 2 asks again
    await expect(approval).to_have_count(1)
    # Approve for the session: the run goes on with the answer the page sent.
    request_id = await approval.get_attribute("data-id")
    await approval.get_by_role("button", name="Approve for session").click()
    await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#messages li[data-role=ASSISTANT]").last).to_contain_text("restarted with this")
    await expect(page.locator("#runs .run")).to_have_count(1)

    # Steer: the held run's live turn takes the message after its approval; no new run.
    await send_from_page(page, "@approval true\n@reply second answer")
    await expect(run_card(page, 2)).to_have_attribute("data-status", "WAITING")
    await send_from_page(page, "keep it short", "steerActive")
    await approval.get_by_role("button", name="Approve", exact=True).click()
    await expect(run_card(page, 2)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#runs .run")).to_have_count(2)
    await expect(page.locator("#messages")).to_contain_text("Steered: keep it short")

    # What the page showed is what the API holds.
    first, second = [await run_card(page, n).get_attribute("data-run") for n in (1, 2)]
    restarted = (await client.gql(REQUESTS, {"r": first}))["run"]
    assert [a["attemptOrdinal"] for a in restarted["attempts"]] == [1, 2], restarted
    assert restarted["attempts"][1]["reason"] == "STEERING_RESTART", restarted
    assert len((await client.gql(REQUESTS, {"r": second}))["run"]["attempts"]) == 1
    answered = await client.gql(ANSWERED, {"id": request_id})
    assert answered["node"]["status"] == "RESOLVED", answered
    assert answered["node"]["response"] == {"decision": "accept_for_session"}, answered
    assert errors == [], errors
    await page.close()


async def test_a_page_too_far_behind_reloads_the_thread_instead_of_replaying(
    browser: Browser, database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    """A server that replays at most 3 events: the page, away while a whole run happened, is told to reload
    (`reload_required`), loads the thread afresh and follows it live from there."""
    env = {"THREADLOOM_MAX_REPLAY": "3"}
    server = ServerProcess(database_url, data_dir, env=env).wait_ready()
    port, token = server.port, server.admin_token
    assert token
    api = Client(server.url, token)
    try:
        project = await make_project(api, "Reload", workspace(tmp_path, "reload"))
        thread = (await make_thread(api, project, "Far behind"))["id"]
        page, errors = await open_page(browser)
        received: list[str] = []
        sent_frames: list[str] = []

        def on_socket(ws: Any) -> None:
            ws.on("framereceived", lambda frame: received.append(str(frame)))
            ws.on("framesent", lambda frame: sent_frames.append(str(frame)))

        page.on("websocket", on_socket)
        await sign_in(page, server.url, token)
        await page.click(f"#threads li[data-id='{thread}']")
        await expect(page.locator("#thread-title")).to_have_text("Far behind")

        server.stop()
        await expect(page.locator("#connection")).to_have_attribute("data-state", re.compile("reconnecting|connecting"))
        await run_elsewhere(database_url, data_dir, token, thread, "@reply Written while the page was away.")

        server = ServerProcess(database_url, data_dir, port=port, env=env).wait_ready()
        await expect(page.locator("#connection")).to_have_attribute("data-state", "live", timeout=30_000)
        await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
        await expect(page.locator("#messages")).to_contain_text("Written while the page was away.")
        assert any("reload_required" in frame for frame in received), "the server never said reload_required"
        live = await send(api, thread, "@reply Live after the reload.")
        assert live
        await expect(run_card(page, 2)).to_have_attribute("data-status", "COMPLETED")
        messages = await page.locator("#messages li").evaluate_all("(items) => items.map((li) => li.dataset.id)")
        assert len(messages) == 4 and len(set(messages)) == 4, messages  # each message once
        # After the reload the page followed from the fresh snapshot's cursor, not from where it was.
        resumed = thread_subscriptions(sent_frames)
        assert resumed[-1]["after"] > resumed[-2]["after"], resumed
        assert errors == [], errors
        await page.close()
    finally:
        await api.aclose()
        server.stop()


def files(folder: str) -> list[str]:
    return sorted(p.name for p in Path(folder).iterdir() if not p.name.startswith("."))


async def test_the_page_rolls_back_what_a_subagent_did(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = workspace(tmp_path, "subagent")
    page, errors = await thread_page(browser, server, client, home, "Delegate")
    # The scripted agent's subagent runs what its approval names, in the thread's workspace.
    await send_from_page(page, "@write parent.txt p\n@subagent @approval echo c > child.txt")
    await page.locator("#requests li").get_by_role("button", name="Approve", exact=True).click()
    await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
    assert files(home) == ["child.txt", "parent.txt"]

    # The subagent's own checkpoints are listed apart from the run's, with their own rollback.
    subagent = page.locator("#checkpoints li.subagent")
    await expect(subagent).to_have_count(2)
    await expect(page.locator("#checkpoints li:not(.subagent)")).to_have_count(1)  # the run's, after run 1
    start = subagent.filter(has_text="#0")  # taken when the subagent started; #1 when it ended
    await start.get_by_role("button", name="Roll back subagent here").click()
    # The files as the subagent found them; its later checkpoint is stale; the run stays COMPLETED.
    await expect(subagent.filter(has_text="#1")).to_contain_text("STALE")
    assert files(home) == ["parent.txt"]
    await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#error")).to_be_empty()
    assert errors == [], errors
    await page.close()


async def test_a_summary_read_before_a_request_opened_does_not_hide_it(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """The page re-reads its summary (queue, pending requests) after events. A read whose snapshot was taken
    before a request opened can come back after the page applied the request's event; the request must stay.

    The race is made certain: the page's own summary document is read before the message is sent, and that
    real, older answer is what the page gets for the first summary it asks for once it holds the request.
    """
    page, errors = await thread_page(browser, server, client, workspace(tmp_path, "stale"), "Stale summary")
    thread = await page.evaluate("state.t.id")
    before = await client.gql(await page.evaluate("SUMMARY"), {"t": thread})
    assert before["thread"]["pendingRequests"] == []
    served_stale = False

    async def summaries(route: Any) -> None:
        nonlocal served_stale
        document = json.loads(route.request.post_data or "{}").get("query", "")
        holds_request = await page.evaluate("state.t.requests.size > 0")
        if not served_stale and "pendingRequests" in document and "messages(" not in document and holds_request:
            served_stale = True
            await route.fulfill(json={"data": before})
        else:
            await route.continue_()

    await page.route("**/graphql", summaries)
    await send_from_page(page, "@approval echo approved > approved.txt")
    await page.wait_for_function("() => state.t.requests.size > 0")
    # Every summary the page asked for has been applied, the stale one included.
    await page.wait_for_function("() => !state.t.summaryBusy && !state.t.summaryTimer")
    assert served_stale
    assert await page.evaluate("[...state.t.requests.values()].map((r) => r.requestStatus)") == ["PENDING"]
    await page.locator("#requests li").get_by_role("button", name="Approve", exact=True).click()
    await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")
    await expect(page.locator("#requests li")).to_have_count(0)
    assert errors == [], errors
    await page.close()


AT_BOTTOM = """() => { const box = document.getElementById("messages");
  return box.scrollHeight - box.scrollTop - box.clientHeight < 24; }"""


async def test_the_page_shows_the_work_tools_todos_times_and_answers_in_words(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """What the agent did, as a newcomer reads it: each command with its output and exit code, the todo list as
    one checklist, when each run and node started and how long it took, an approval's answer in words, a
    thread created without a title named by its first message, messages that follow the newest one."""
    project = await make_project(client, "Show the work", workspace(tmp_path, "work"))
    page, errors = await open_page(browser)

    # Before signing in: the sign-in form alone (no empty sidebar under it), and the page has its icon.
    await page.goto(server.url + "/dashboard")
    await expect(page.locator("#login")).to_be_visible()
    await expect(page.locator("#app")).to_be_hidden()
    await expect(page.locator("#sidebar")).to_be_hidden()
    icon = await page.locator("link[rel=icon]").get_attribute("href")
    async with httpx.AsyncClient(base_url=server.url + "/dashboard/") as http:
        served = await http.get(str(icon))
    assert served.status_code == 200 and served.headers["content-type"].startswith("image/svg+xml"), served
    assert b"<svg" in served.content

    # A thread created without a title is "New thread" until its first message names it, here and in the list.
    assert client.token
    await page.fill("#token", client.token)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#connection")).to_have_attribute("data-state", "live")
    await page.select_option("#project", project)
    await page.click("#new-thread button[type=submit]")
    await expect(page.locator("#thread-title")).to_have_text("New thread")
    thread = await page.evaluate("state.t.id")
    await send_from_page(page, "@reply Looking at the login test.")
    await expect(page.locator("#thread-title")).to_have_text("@reply Looking at the login test.")
    await expect(page.locator(f"#threads li[data-id='{thread}'] .title")).to_have_text(
        "@reply Looking at the login test."
    )
    await expect(run_card(page, 1)).to_have_attribute("data-status", "COMPLETED")

    # A run that works through a todo list, runs two commands (one fails) and asks for an approval.
    await send_from_page(
        page,
        "@todo Read the code; Fix the bug; Run the tests\n@tool echo all good\n@tool echo broken; exit 3\n"
        "@approval echo approved\n@reply Done.",
    )
    await page.locator("#requests li").get_by_role("button", name="Approve", exact=True).click()
    await expect(run_card(page, 2)).to_have_attribute("data-status", "COMPLETED")

    # The todo list is one checklist, every step ticked; the activity list has one line for it, not one per update.
    todo = page.locator("#todo li")
    await expect(todo.locator(".step")).to_have_text(["Read the code", "Fix the bug", "Run the tests"])
    await expect(page.locator("#todo-count")).to_have_text("3/3 done")
    assert await todo.locator("input[type=checkbox]").evaluate_all("(boxes) => boxes.map((b) => b.checked)") == [
        True,
        True,
        True,
    ]
    await expect(page.locator("#activities li[data-kind='plan.updated']")).to_have_count(1)

    # Each command with its exit code and output; the failed one is open, the good one folded.
    tools = run_card(page, 2).locator("li[data-kind=TOOL_CALL]")  # the two, and the approved command's own
    await expect(tools).to_have_count(3)
    good, bad = tools.filter(has_text="echo all good"), tools.filter(has_text="echo broken")
    await expect(good).to_have_count(1)
    await expect(bad).to_have_count(1)
    await expect(good.locator(".exit")).to_have_text(" exit 0")
    await expect(bad.locator(".exit")).to_have_text(" exit 3")
    await expect(bad.locator("details.tool")).to_have_attribute("open", "")
    await expect(bad.locator(".output")).to_be_visible()
    await expect(bad.locator(".output")).to_contain_text("broken")
    await expect(good.locator(".output")).to_be_hidden()
    await good.locator("summary").click()  # opened by the reader, it stays open through the next renders
    await expect(good.locator(".output")).to_contain_text("all good")

    # When: the run and each node carry their start time and, once ended, how long they took.
    took = re.compile(r"^ · \d+(\.\d)? (ms|s)$|^ · \d+ min \d+ s$")
    await expect(run_card(page, 2).locator(".run-head .when time")).to_have_count(1)
    await expect(run_card(page, 2).locator(".run-head .took")).to_have_text(took)
    assert await tools.locator(".node-head .when time").count() == 3
    await expect(tools.first.locator(".node-head .took")).to_have_text(took)
    await expect(page.locator("#messages li").first.locator("time")).to_have_count(1)

    # The approval's answer in words, not a dict.
    resolved = page.locator("#activities li[data-kind='approval.resolved']")
    await expect(resolved).to_contain_text("Approved: echo approved")
    assert "{" not in (await resolved.all_text_contents())[0]

    # A long reply: the messages follow it to the bottom; a reader who scrolled up stays where they are ...
    # ... behind a subagent with a todo list of its own: the checklist stays the thread's (its root turn's).
    await send_from_page(page, "@subagent @todo Child step\n@reply " + " ".join(f"line{n}" for n in range(700)))
    await expect(run_card(page, 3)).to_have_attribute("data-status", "COMPLETED")
    assert await page.evaluate("[...state.t.plans.values()].some((p) => p.items && p.items[0].step === 'Child step')")
    await expect(todo.locator(".step")).to_have_text(["Read the code", "Fix the bug", "Run the tests"])
    await expect(page.locator("#messages li[data-role=ASSISTANT]").last).to_contain_text("line699")
    assert await page.locator("#messages").evaluate("(box) => box.scrollHeight > box.clientHeight")  # it overflows
    await page.wait_for_function(AT_BOTTOM)
    await page.locator("#messages").evaluate("(box) => { box.scrollTop = 0; }")
    await page.wait_for_function("() => !messagesPinned")
    assert await send(client, thread, "@reply Written while you read above.", await page.evaluate("DEVICE"))
    await expect(page.locator("#messages li[data-role=ASSISTANT]").last).to_contain_text("while you read above")
    assert await page.locator("#messages").evaluate("(box) => box.scrollTop") == 0
    await page.locator("#messages").evaluate("(box) => { box.scrollTop = box.scrollHeight; }")
    await page.wait_for_function("() => messagesPinned")
    assert errors == [], errors
    await page.close()


async def test_the_page_takes_the_lease_when_it_sends_shows_who_drives_and_takes_over(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """Two tabs (two devices) on one thread: the first to send drives it; the other reads who drives, is refused
    with WRITER_LEASE_HELD when it sends, and takes over with its button, which the first tab is told of live.
    Leaving the thread releases the lease."""
    laptop, errors = await thread_page(browser, server, client, workspace(tmp_path, "lease"), "Driven")
    thread = await laptop.evaluate("state.t.id")
    await make_thread(client, (await client.gql(PROJECT_OF, {"t": thread}))["thread"]["project"]["id"], "Other")
    await send_from_page(laptop, "@reply from the laptop")
    laptop_device = await laptop.evaluate("DEVICE")
    await expect(laptop.locator("#lease")).to_have_text("you are driving this thread")
    refused = await client.post(SEND, {"t": thread, "text": "@reply no device"})  # the API, naming no device
    assert refused.json()["data"]["sendMessage"]["userErrors"][0]["code"] == "WRITER_LEASE_HELD"

    phone, phone_errors = await open_page(browser)
    assert client.token
    await sign_in(phone, server.url, client.token)
    await phone.click(f"#threads li[data-id='{thread}']")
    await expect(phone.locator("#lease")).to_contain_text(f"driven by {laptop_device}")
    await expect(phone.locator("#lease")).to_have_attribute("data-holder", "other")
    await phone.fill("#message", "@reply from the phone")
    await phone.click("#send button[type=submit]")
    await expect(phone.locator("#error")).to_contain_text("WRITER_LEASE_HELD")
    await expect(phone.locator("#message")).to_have_value("@reply from the phone")  # not sent

    await phone.click("#take-over")
    await expect(phone.locator("#lease")).to_have_text("you are driving this thread")
    phone_device = await phone.evaluate("DEVICE")
    await expect(laptop.locator("#lease")).to_contain_text(f"driven by {phone_device}")  # told on its stream
    await expect(laptop.locator("#take-over")).to_be_visible()
    await send_from_page(phone, "@reply from the phone")
    await expect(run_card(laptop, 2)).to_have_attribute("data-status", "COMPLETED")

    await phone.click("#threads li:has-text('Other')")  # leaving the thread gives the lease up
    await expect(laptop.locator("#lease")).to_have_text("")
    await expect(laptop.locator("#take-over")).to_be_hidden()
    assert errors == [] and phone_errors == [], (errors, phone_errors)
    await laptop.close()
    await phone.close()


async def test_the_page_shows_what_runs_and_the_thread_cost_and_a_budgets_state(
    browser: Browser, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """Each run's cost and the thread's, then a thread budget's state: spent of its limit, and once a call
    crosses it, exceeded, with the queue held BUDGET_EXCEEDED (docs/dashboard.md)."""
    page, errors = await thread_page(browser, server, client, workspace(tmp_path, "costs"), "Costs")
    thread = await page.evaluate("sessionStorage.getItem('threadloom.thread')")
    budget = """mutation($t: ID!) { setBudget(input: {threadId: $t, maxCostUsd: 1.0, window: TOTAL, action: STOP}) {
      userErrors { code } } }"""
    assert (await client.gql(budget, {"t": thread}))["setBudget"]["userErrors"] == []
    shown = page.locator("#budgets .budget")
    await expect(shown).to_have_text("total budget: $0 of $1 · stop")
    await send_from_page(page, "@usage 100 20 0.5\n@reply first")
    await expect(run_card(page, 1).locator(".cost")).to_have_text("cost $0.50")
    await expect(page.locator("#thread-cost")).to_have_text("cost $0.50")
    await expect(shown).to_have_attribute("data-exceeded", "false")
    await send_from_page(page, "@usage 100 20 0.75\n@await never-cost\n@reply second")
    await expect(shown).to_have_attribute("data-exceeded", "true")
    await expect(shown).to_have_text("total budget: $1.25 of $1 · stop · exceeded")
    await expect(page.locator("#queue-held")).to_have_text("queue held (BUDGET_EXCEEDED)")
    await expect(run_card(page, 2)).to_have_attribute("data-status", "INTERRUPTED")
    await expect(run_card(page, 2).locator(".cost")).to_have_text("cost $0.75")
    assert errors == []
    await page.close()
