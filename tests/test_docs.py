"""The repository stands on its own: nothing a user gets when cloning it points outside it.

README, docs/, the sources (docstrings, comments, schema descriptions), the exported schema and the client
examples must not send readers to a design folder beside the checkout, and every relative link of the
Markdown docs must lead to a file that exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "docs", "src", "schema", "client-examples")
# Built from parts so this file does not contain what it forbids (tests/ is not scanned, but grep is).
FORBIDDEN = ("../" + "shared", "DESIGN" + " §")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def repository_files(root: Path, tops: tuple[str, ...]) -> list[Path]:
    """Files git knows or would add (tracked and untracked, not ignored), so build output never counts."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *tops],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return sorted({root / name for name in listed if (root / name).is_file()})


def forbidden_mentions(files: list[Path], root: Path) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files say nothing to readers
        for number, line in enumerate(text.splitlines(), start=1):
            for needle in FORBIDDEN:
                if needle in line:
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def broken_links(markdown: list[Path], root: Path) -> list[str]:
    """Relative links (outside code blocks) whose target file does not exist; URLs and anchors are skipped."""
    broken = []
    for path in markdown:
        text = FENCE.sub("", path.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file_part = target.split("#", 1)[0]
            if not (path.parent / file_part).exists():
                broken.append(f"{path.relative_to(root)}: {target}")
    return broken


def test_no_references_outside_the_repository() -> None:
    files = repository_files(ROOT, SCANNED)
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    assert forbidden_mentions(files, ROOT) == []


def test_every_relative_link_in_the_docs_resolves() -> None:
    markdown = [p for p in repository_files(ROOT, ("README.md", "docs")) if p.suffix == ".md"]
    assert len(markdown) >= 8  # README and docs/, lifecycle pages included
    assert broken_links(markdown, ROOT) == []


def test_the_lifecycle_pages_exist_and_are_linked() -> None:
    pages = [
        "threads-and-runs.md",
        "steering-and-queue.md",
        "interruption-and-stop.md",
        "resumption-and-recovery.md",
        "approvals-and-questions.md",
        "plans-and-todos.md",
        "delegation.md",
    ]
    index = (ROOT / "docs/lifecycles/README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in pages:
        assert (ROOT / "docs/lifecycles" / page).is_file(), page
        assert f"]({page})" in index, page
        assert f"](docs/lifecycles/{page})" in readme, page


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The two scanners report a forbidden mention and a dangling link, so an empty result means something."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/a.md").write_text(
        f"See `{FORBIDDEN[0]}/x.md` and {FORBIDDEN[1]}3.\n[ok](b.md) [gone](missing.md#part) [web](https://x.org)\n"
        "```\n[in code](nowhere.md)\n```\n[anchor](#top)\n"
    )
    (tmp_path / "docs/b.md").write_text("fine\n")
    files = repository_files(tmp_path, ("docs",))
    assert [p.name for p in files] == ["a.md", "b.md"]
    assert len(forbidden_mentions(files, tmp_path)) == 2
    assert broken_links(files, tmp_path) == ["docs/a.md: missing.md#part"]
