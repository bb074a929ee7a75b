"""Test names say what they check: a test function is named in at least four words after `test_`.

A name like `test_simple` or `test_auth` tells a reader of a failure nothing; `test_rollback_refusals_change_nothing`
does. The one exception is a table test with `pytest.mark.parametrize` on it, whose ids carry the cases (the
name plus each id says what failed). The check reads the files with `ast`, so it sees methods of test classes
and async tests too, and nothing is imported or run.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MIN_WORDS = 4


def _parametrized(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether `pytest.mark.parametrize(...)` (or `mark.parametrize`) decorates the function."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "parametrize":
            owner = target.value
            if isinstance(owner, ast.Attribute) and owner.attr == "mark":
                return True
            if isinstance(owner, ast.Name) and owner.id == "mark":
                return True
    return False


def short_names(path: Path) -> list[str]:
    """`file:line:name` of each test function in `path` named in fewer than MIN_WORDS words, unless parametrized."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test_"):
            continue
        words = [word for word in node.name.removeprefix("test_").split("_") if word]
        if len(words) < MIN_WORDS and not _parametrized(node):
            found.append((node.lineno, f"{path.name}:{node.lineno}:{node.name}"))
    return [name for _, name in sorted(found)]  # `ast.walk` goes breadth first: methods come after functions


def test_every_test_function_name_has_at_least_four_words() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100  # the suite's own files were found
    short = [name for path in files for name in short_names(path)]
    assert short == [], f"name these tests in at least {MIN_WORDS} words saying what they check: {short}"


def test_the_name_check_catches_short_names_in_a_temporary_file(tmp_path: Path) -> None:
    """The twin: the same check on a file holding short names, long names, a parametrized table and helpers."""
    module = tmp_path / "test_sample.py"
    module.write_text(
        "import pytest\n"
        "from pytest import mark\n"
        "def test_simple(): pass\n"
        "async def test_two_processes(): pass\n"
        "class TestThings:\n"
        "    def test_auth(self): pass\n"
        "    def test_a_wrong_token_is_refused(self): pass\n"
        "def test_a_b_c(): pass\n"
        "def test__double__underscores__only(): pass\n"
        "@pytest.mark.parametrize('x', [1, 2])\n"
        "def test_drain(x): pass\n"
        "@mark.parametrize('x', [1])\n"
        "def test_edit(x): pass\n"
        "@pytest.mark.slow\n"
        "def test_crash(): pass\n"
        "def test_the_queue_resumes_after_a_failure(): pass\n"
        "def helper(): pass\n"
    )
    assert short_names(module) == [
        "test_sample.py:3:test_simple",
        "test_sample.py:4:test_two_processes",
        "test_sample.py:6:test_auth",
        "test_sample.py:8:test_a_b_c",
        "test_sample.py:9:test__double__underscores__only",
        "test_sample.py:15:test_crash",  # a mark other than parametrize is no exception
    ]
