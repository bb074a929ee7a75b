"""GraphiQL at /graphql in a real headless Chromium, with every request to anything but the server blocked.

The IDE is switched on in a production server (`THREADLOOM_GRAPHIQL=1`, no dev mode). It must load from the
files the Python package ships (nothing from a CDN), run a query with the token typed into its token field,
keep that token across a reload within the tab's session (sessionStorage, never localStorage) and not in a new
session, and open with example operations that the server's schema accepts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import Any

import httpx
import pytest
from graphql import build_client_schema, get_introspection_query, parse, validate
from playwright.async_api import Browser, BrowserContext, Page, expect

from tests.support.browser import launched
from tests.support.graphql import make_project, make_thread
from tests.support.pg import PgServer
from tests.support.runs import send
from tests.support.server import Client, ServerProcess, serving

RUN_QUERY = "button.graphiql-execute-button"
RESULT = "section.result-window"
SET_VARIABLES = """(text) => {
  const editors = [...document.querySelectorAll('.graphiql-editor-tool .CodeMirror')];
  editors.find((e) => e.offsetParent !== null).CodeMirror.setValue(text);
}"""
QUERY_TEXT = "() => document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.getValue()"


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A production server (no THREADLOOM_DEV) with the IDE switched on."""
    with serving(database_url, tmp_path_factory.mktemp("graphiql"), {"THREADLOOM_GRAPHIQL": "1"}) as proc:
        yield proc


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One Chromium for the module (tests/support/browser.py); each test opens a context of its own."""
    async with launched() as chromium:
        yield chromium


class Offline:
    """A browser context that reaches only the server: every other request is aborted and remembered."""

    def __init__(self, context: BrowserContext, server: ServerProcess) -> None:
        self.context = context
        self.origin = server.url
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.authorizations: list[str | None] = []

    @classmethod
    async def open(cls, browser: Browser, server: ServerProcess) -> Offline:
        offline = cls(await browser.new_context(viewport={"width": 1280, "height": 900}), server)
        await offline.context.route("**/*", offline._only_the_server)
        return offline

    async def _only_the_server(self, route: Any) -> None:
        url = route.request.url
        if url == self.origin or url.startswith(self.origin + "/"):
            if route.request.method == "POST" and url == self.origin + "/graphql":
                self.authorizations.append(await route.request.header_value("authorization"))
            await route.continue_()
        else:
            self.blocked.append(url)
            await route.abort()

    async def page(self) -> Page:
        page = await self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        await page.goto(self.origin + "/graphql")
        await expect(page.locator(".graphiql-container")).to_be_visible()
        return page


async def type_token(page: Page, token: str) -> None:
    await page.fill("#token", token)
    await page.press("#token", "Enter")  # the page keeps the token and loads the schema again with it


async def run_and_read(page: Page) -> str:
    await page.click(RUN_QUERY)
    result = page.locator(RESULT)
    await expect(result).to_contain_text('"data"')
    return await result.inner_text()


async def test_the_ide_loads_offline_runs_a_query_with_the_token_and_keeps_it_within_the_session(
    browser: Browser, server: ServerProcess
) -> None:
    token = server.admin_token
    assert token
    offline = await Offline.open(browser, server)
    try:
        page = await offline.page()
        assert await page.input_value("#token") == ""
        await type_token(page, token)
        text = await run_and_read(page)  # the first tab: `query Viewer { viewer { scope … } }`
        assert '"scope": "ADMIN"' in text
        assert f"Bearer {token}" in offline.authorizations

        await page.reload()
        await expect(page.locator(".graphiql-container")).to_be_visible()
        assert await page.input_value("#token") == token  # the same tab's session
        await page.locator(RESULT).wait_for()
        assert '"scope": "ADMIN"' in await run_and_read(page)
        stored = await page.evaluate("() => ({session: {...sessionStorage}, local: JSON.stringify({...localStorage})})")
        assert stored["session"]["threadloom.token"] == token
        assert token not in stored["local"]  # never kept beyond the session

        assert offline.blocked == []  # nothing but the server was asked for (a CDN request would show here)
        assert offline.errors == []
    finally:
        await offline.context.close()

    fresh = await Offline.open(browser, server)  # another session: the token is not there
    try:
        page = await fresh.page()
        assert await page.input_value("#token") == ""
        assert fresh.blocked == []
    finally:
        await fresh.context.close()


async def test_the_preloaded_examples_are_valid_operations_of_the_schema(
    browser: Browser, server: ServerProcess
) -> None:
    offline = await Offline.open(browser, server)
    try:
        page = await offline.page()
        tabs = page.locator(".graphiql-tab")
        await expect(tabs).to_have_count(4)
        operations = []
        for index in range(4):
            await tabs.nth(index).locator("button.graphiql-tab-button").click()
            operations.append(await page.evaluate(QUERY_TEXT))
    finally:
        await offline.context.close()
    assert all(operations) and len(set(operations)) == 4
    kinds = ["query", "query", "mutation", "subscription"]
    assert [op.split("\n", 1)[1].split(" ", 1)[0] for op in operations] == kinds
    # Checked against the schema this server serves (its introspection), the way GraphiQL's editor checks them.
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        response = await http.post(
            "/graphql",
            json={"query": get_introspection_query()},
            headers={"authorization": f"Bearer {server.admin_token}"},
        )
    schema = build_client_schema(response.json()["data"])
    for operation in operations:
        assert validate(schema, parse(operation)) == [], operation


async def test_the_page_and_its_files_come_from_the_package_without_a_token(server: ServerProcess) -> None:
    package = resources.files("threadloom.api.graphiql_assets")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        page = await http.get("/graphql", headers={"accept": "text/html"})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
        assert "http" not in page.text.replace("http-equiv", "")  # no absolute URL: nothing from elsewhere
        for name in (
            "graphiql.min.js",
            "graphiql.min.css",
            "react.production.min.js",
            "react-dom.production.min.js",
            "start.js",
        ):
            served = await http.get(f"/graphiql/{name}")
            assert served.status_code == 200 and served.content == package.joinpath(name).read_bytes(), name
        # Its twin: with an operation in the URL the same browser-looking GET is an API call, and needs the token.
        refused = await http.get("/graphql", params={"query": "{ viewer { scope } }"}, headers={"accept": "text/html"})
        assert refused.status_code == 401 and refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"


async def test_a_subscription_from_the_ide_streams_over_server_sent_events(
    browser: Browser, server: ServerProcess
) -> None:
    """The ThreadEvents example, run in the IDE: the page's fetcher streams it over SSE and shows the replay."""
    token = server.admin_token
    assert token
    client = Client(server.url, token)
    thread = (await make_thread(client, await make_project(client, "IDE")))["id"]
    offline = await Offline.open(browser, server)
    accepts: list[str | None] = []
    offline.context.on(
        "request", lambda request: accepts.append(request.headers.get("accept")) if request.method == "POST" else None
    )
    try:
        page = await offline.page()
        await type_token(page, token)
        await page.locator(".graphiql-tab").nth(3).locator("button.graphiql-tab-button").click()
        # Run only once the tab's document is in the editor: a click landing first ran the previous tab's
        # operation name against it ("Unknown operation named Viewer", seen in a loaded full run).
        await page.wait_for_function(f"() => ({QUERY_TEXT})().includes('subscription ThreadEvents')")
        await page.evaluate(SET_VARIABLES, json.dumps({"threadId": thread}))
        await page.click(RUN_QUERY)
        await expect(page.locator(RESULT)).to_contain_text('"type": "synchronized"')
        # A live event replaces the marker in the result pane (GraphiQL shows a subscription's latest result).
        await send(client, thread, "@reply from the IDE test")
        await expect(page.locator(RESULT)).not_to_contain_text('"synchronized"')
        assert '"sequence"' in await page.locator(RESULT).inner_text()
        assert "text/event-stream" in accepts
        assert offline.blocked == [] and offline.errors == []
    finally:
        await offline.context.close()
        await client.aclose()


CHOSEN = "(params) => window.threadloomGraphiql.chosenOperation(params)"


async def test_a_run_sends_the_operation_its_text_holds_not_a_stale_name(
    browser: Browser, server: ServerProcess
) -> None:
    """GraphiQL hands its fetcher the operation name of its last parse, 100 ms behind the editor: right after a
    tab switch the text was the new tab's and the name the old one's, and the server refused the run ("Unknown
    operation named Viewer"). The page's fetcher reads the operations from the text it sends: a name the text
    does not hold gives way to the text's only operation, which also decides SSE or POST. The twins: a name the
    text holds is kept, and with several operations and none named the request goes as it is."""
    offline = await Offline.open(browser, server)
    try:
        page = await offline.page()
        events = (
            "# events (server-sent events)\nsubscription ThreadEvents($t: ID!) { threadEvents(threadId: $t) { type } }"
        )
        stale = await page.evaluate(CHOSEN, {"query": events, "operationName": "Viewer"})
        assert stale == {"params": {"query": events, "operationName": "ThreadEvents"}, "type": "subscription"}
        both = 'mutation A($x: In = {a: "query B {"}) { a }\nquery C { c }'
        kept = await page.evaluate(CHOSEN, {"query": both, "operationName": "C"})
        assert kept == {"params": {"query": both, "operationName": "C"}, "type": "query"}
        unknown = await page.evaluate(CHOSEN, {"query": both, "operationName": "Viewer"})
        assert unknown == {"params": {"query": both, "operationName": "Viewer"}, "type": "query"}
        anonymous = await page.evaluate(CHOSEN, {"query": "{ viewer { scope } }", "operationName": "Viewer"})
        assert anonymous["params"]["operationName"] is None and anonymous["type"] == "query"  # sent without one
        assert offline.errors == []
    finally:
        await offline.context.close()
