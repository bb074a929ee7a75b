"""The project's exclude list: gitignore-style patterns, matched here rather than by git.

Why not let git match them: git's own directory walk also honours every `.gitignore` in the
workspace (there is no switch to turn per-directory ignore files off), and a checkpoint must
capture what the user's `.gitignore` hides (build output an agent made is part of what a rollback
undoes). So the store walks the workspace itself (`walk.py`) and applies only these patterns, with
git's semantics:

- blank lines and `#` comments are skipped; `\\#`, `\\!` and `\\ ` escape; trailing spaces are dropped;
- `!pattern` re-includes (but nothing under an excluded directory can come back: it is never walked);
- a trailing `/` matches directories only;
- a pattern with a `/` at its start or middle is anchored at the workspace root, otherwise it matches
  a name at any depth;
- `*` and `?` never cross `/`; `**/` (leading or middle) spans any directories, `/**` at the end
  matches everything inside; `[...]` classes (`!`/`^` negate).

The last matching pattern decides, as in git.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode


@dataclass(frozen=True, slots=True)
class _Rule:
    regex: re.Pattern[str]
    negated: bool
    dir_only: bool
    anchored: bool


def _class(pattern: str, start: int) -> tuple[str, int] | None:
    """Translate the `[...]` starting at `start`; None when it is not closed (then `[` is literal)."""
    i = start + 1
    negate = i < len(pattern) and pattern[i] in "!^"
    if negate:
        i += 1
    body: list[str] = []
    first = True
    while i < len(pattern):
        c = pattern[i]
        if c == "]" and not first:
            inner = "".join(body)
            return (f"[^/{inner}]" if negate else f"(?!/)[{inner}]"), i + 1
        if c == "\\" and i + 1 < len(pattern):
            body.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "-" and body and i + 1 < len(pattern) and pattern[i + 1] != "]":
            body.append("-")
            i += 1
        else:
            body.append(re.escape(c) if c != "-" else r"\-")
            i += 1
        first = False
    return None


def _translate(pattern: str) -> str:
    """wildmatch with WM_PATHNAME (git's matching of ignore patterns) as a Python regex."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            at_boundary = i == 0 or pattern[i - 1] == "/"
            if j - i >= 2 and at_boundary and j == n:
                out.append(".*")  # `dir/**`: everything inside; `**` alone: everything
            elif j - i >= 2 and at_boundary and pattern[j] == "/":
                out.append("(?:.*/)?")  # `**/`: zero or more directories
                j += 1
            else:
                out.append("[^/]*")
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            translated = _class(pattern, i)
            if translated is None:
                out.append(re.escape(c))
                i += 1
            else:
                out.append(translated[0])
                i = translated[1]
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end > 0 and line[end - 1] == " " and not (end >= 2 and line[end - 2] == "\\"):
        end -= 1
    return line[:end]


def _parse(line: str) -> _Rule | None:
    line = _strip_trailing_spaces(line)
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    dir_only = line.endswith("/")
    if dir_only:
        line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    if line.startswith("/"):
        line = line[1:]
    return _Rule(re.compile(_translate(line), re.DOTALL), negated, dir_only, anchored)


class Excludes:
    """A compiled exclude list; `excluded(path, is_dir)` takes a workspace-relative posix path."""

    def __init__(self, patterns: Sequence[str]) -> None:
        for pattern in patterns:
            if "\n" in pattern or "\r" in pattern or "\0" in pattern:
                raise CheckpointError(CheckpointErrorCode.INVALID_EXCLUDE, f"exclude pattern spans lines: {pattern!r}")
        self.patterns: tuple[str, ...] = tuple(patterns)
        self._rules = [rule for rule in (_parse(p) for p in patterns) if rule is not None]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def excluded(self, path: str, is_dir: bool) -> bool:
        """Whether this entry itself matches (its parents are the walk's business)."""
        name = path.rsplit("/", 1)[-1]
        for rule in reversed(self._rules):
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.fullmatch(path if rule.anchored else name):
                return not rule.negated
        return False

    def covers(self, path: str) -> bool:
        """Whether a file at `path` lies in an excluded place: itself or any parent directory."""
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if self.excluded("/".join(parts[:depth]), True):
                return True
        return self.excluded(path, False)

    def file_text(self) -> str:
        """The list as an ignore file (`info/exclude`), for people and for git tools looking."""
        header = "# Written by Threadloom: the project's checkpoint exclude list.\n"
        return header + "".join(f"{p}\n" for p in self.patterns)
