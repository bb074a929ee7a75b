"""What changed between two checkpoints, parsed from git's NUL-separated output.

One `diff-tree --raw --numstat` of a tree pair, with rename detection (`-M`) so that a moved file shows as
one rename rather than a delete and an add: its raw records give each path's status and old path, the numstat
records after them its added/removed line counts (`-` for binary content).
"""

from __future__ import annotations

import os

from threadloom.domain.checkpoints import CheckpointFile, CheckpointFileStatus

# git's well-known id of the empty tree: "no checkpoint yet" diffs against it.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"

# The one git call a diff of two trees takes (`changes_of` reads its output).
DIFF_TREE = ("diff-tree", "-r", "-z", "-M", "--raw", "--numstat", "--no-ext-diff", "--no-textconv")

# A diff's entries are the domain's checkpoint files: what git reports is recorded as is.
FileChange = CheckpointFile
FileStatus = CheckpointFileStatus

_STATUS = {
    "A": FileStatus.ADDED,
    "M": FileStatus.MODIFIED,
    "T": FileStatus.MODIFIED,  # type change (file <-> symlink) is a modification of the path
    "D": FileStatus.DELETED,
    "R": FileStatus.RENAMED,
}


def _decode(raw: bytes) -> str:
    return os.fsdecode(raw)


def parse_raw(output: bytes) -> list[tuple[FileStatus, str, str | None]]:
    """`diff-tree -r -z --raw -M` → (status, path, old path)."""
    fields = output.split(b"\0")
    changes: list[tuple[FileStatus, str, str | None]] = []
    i = 0
    while i < len(fields) and fields[i]:
        header = fields[i].decode()
        letter = header.split(" ")[-1][:1]
        status = _STATUS.get(letter, FileStatus.MODIFIED)
        if letter in "RC":
            changes.append((status, _decode(fields[i + 2]), _decode(fields[i + 1])))
            i += 3
        else:
            changes.append((status, _decode(fields[i + 1]), None))
            i += 2
    return changes


def parse_numstat(output: bytes) -> dict[str, tuple[int, int, bool]]:
    """`diff-tree -r -z --numstat -M` → path (the new one for renames) → (additions, deletions, binary)."""
    fields = output.split(b"\0")
    counts: dict[str, tuple[int, int, bool]] = {}
    i = 0
    while i < len(fields) and fields[i]:
        added, deleted, path = fields[i].split(b"\t", 2)
        if path:
            i += 1
        else:  # a rename: the old and new paths follow as fields of their own
            path = fields[i + 2]
            i += 3
        binary = added == b"-"
        key = _decode(path)
        before = counts.get(key, (0, 0, False))  # a type change may come as a delete and an add
        counts[key] = (
            before[0] + (0 if binary else int(added)),
            before[1] + (0 if binary else int(deleted)),
            before[2] or binary,
        )
    return counts


def combine(raw: bytes, numstat: bytes) -> list[FileChange]:
    counts = parse_numstat(numstat)
    changes = []
    for status, path, old_path in parse_raw(raw):
        additions, deletions, binary = counts.get(path, (0, 0, False))
        changes.append(FileChange(path, status, additions, deletions, old_path, binary))
    changes.sort(key=lambda change: change.path)
    return changes


def split_output(output: bytes) -> tuple[bytes, bytes]:
    """`diff-tree -r -z -M --raw --numstat` → (its raw records, its numstat records). The raw ones come first;
    each starts with a header beginning with `:` and is followed by one path, or two for a rename or copy.
    A numstat record starts with a count or `-`, never `:`, so the first field after a whole raw record that
    is no header begins the numstat part."""
    fields = output.split(b"\0")
    i = 0
    while i < len(fields) and fields[i].startswith(b":"):
        i += 3 if fields[i].rsplit(b" ", 1)[-1][:1] in (b"R", b"C") else 2
    return b"\0".join(fields[:i]) + b"\0", b"\0".join(fields[i:])


def changes_of(output: bytes) -> list[FileChange]:
    """The changes one `diff-tree -r -z -M --raw --numstat` printed."""
    return combine(*split_output(output))
