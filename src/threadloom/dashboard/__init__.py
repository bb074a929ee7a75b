"""The live dashboard: static files served at /dashboard, no build step and nothing from a CDN.

The page talks only to /graphql with the token the user types in (kept in sessionStorage), so the files
themselves need no token and reveal nothing. The Content-Security-Policy allows scripts, styles and
connections from this origin only: a string from the server that slipped into the page as markup could not
load or run anything.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


async def _file(request: Request) -> Response:
    name = request.path_params.get("name", "index.html")
    if name not in TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    return Response(_read(name), media_type=TYPES[name], headers=HEADERS)


async def _slash(request: Request) -> Response:
    return RedirectResponse("/dashboard/", status_code=308)


def routes() -> list[BaseRoute]:
    """/dashboard (redirects to /dashboard/ so the page's relative links resolve), the page and its files."""
    return [Route("/dashboard", _slash), Route("/dashboard/", _file), Route("/dashboard/{name}", _file)]
