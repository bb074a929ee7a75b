"""The error-level lines of a test server's log (one JSON object per line, threadloom.logs), for a test that
must show nothing went wrong inside the server while every answer looked fine."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import orjson

SERIOUS = frozenset({"error", "critical"})


def errors(lines: Iterable[str], allowed: Mapping[str, str] = {}) -> list[str]:
    """The error and critical lines of `lines`, less those matching a pattern of `allowed` (pattern → why it
    is expected; a regular expression searched in the whole line, its `msg` and its `exc` when it has one). A
    line that is not JSON is kept when it reads as an error (a traceback, a library writing to stderr)."""
    found = []
    for line in list(lines):
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            if re.search(r"\b(Traceback|ERROR|CRITICAL)\b", line):
                found.append(line)
            continue
        if not isinstance(record, dict) or str(record.get("level")) not in SERIOUS:
            continue
        if not any(re.search(pattern, line) for pattern in allowed):
            found.append(line)
    return found
