"""GraphiQL at /graphql for a browser, from files inside the package (`graphiql_assets`), never a CDN.

On in dev mode, and wherever `THREADLOOM_GRAPHIQL=1` (`Settings.ide`). The page and its files need no token
and hold no data: the token is typed into the page, kept in the tab's sessionStorage and sent by the page's
own fetcher. The Content-Security-Policy lets the page load scripts and connect only to this origin, so the IDE
works on a machine that reaches nothing else and cannot be made to load code from elsewhere. Inline styles
stay allowed: GraphiQL's editors set them.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

PACKAGE = "threadloom.api.graphiql_assets"
TYPES = {
    "graphiql.min.js": "text/javascript; charset=utf-8",
    "graphiql.min.css": "text/css; charset=utf-8",
    "react.production.min.js": "text/javascript; charset=utf-8",
    "react-dom.production.min.js": "text/javascript; charset=utf-8",
    "start.js": "text/javascript; charset=utf-8",
    "ide.css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self' data:; font-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "referrer-policy": "no-referrer"}

# Relative links: the page is /graphql, so they resolve to /graphiql/… (behind a path prefix too).
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Threadloom GraphiQL</title>
<link rel="stylesheet" href="graphiql/graphiql.min.css">
<link rel="stylesheet" href="graphiql/ide.css">
</head>
<body>
<form id="bar">
<label>Token <input id="token" type="password" autocomplete="off" spellcheck="false" placeholder="tl_…"></label>
<small>kept in this tab only (sessionStorage), sent as <code>Authorization: Bearer</code></small>
</form>
<div id="graphiql">Loading…</div>
<script src="graphiql/react.production.min.js"></script>
<script src="graphiql/react-dom.production.min.js"></script>
<script src="graphiql/graphiql.min.js"></script>
<script src="graphiql/start.js"></script>
</body>
</html>
"""


def wanted(method: str, accept: str, params: Mapping[str, str]) -> bool:
    """A browser loading the page: GET, asking for HTML, no operation in the URL (curl's `*/*` is not one)."""
    return method == "GET" and "text/html" in accept and not params.get("query") and not params.get("extensions")


def page() -> Response:
    return HTMLResponse(PAGE, headers={**HEADERS, "cache-control": "no-cache"})


def _read(name: str) -> bytes:
    return resources.files(PACKAGE).joinpath(name).read_bytes()


async def _file(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    # The vendored bundles change only with a release; ours (start.js, ide.css) are small.
    cache = "public, max-age=86400" if name.endswith(".min.js") or name.endswith(".min.css") else "no-cache"
    return Response(_read(name), media_type=TYPES[name], headers={**HEADERS, "cache-control": cache})


def routes(enabled: bool) -> list[BaseRoute]:
    """/graphiql/{name}: the IDE's files, when the IDE is on (they need no token: they hold no data)."""
    return [Route("/graphiql/{name}", _file)] if enabled else []
