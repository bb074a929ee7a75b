"""One seed convention for every randomised test, so a failure found by chance can be replayed on purpose.

A randomised test takes its seed from `THREADLOOM_TEST_SEED` when it is set, else draws a fresh one per run:
each run explores new histories, and a failing one says how to run it again. The seed and the exact command
line to replay the test with it are printed (pytest shows a failing test's captured output), recorded as a
test property (`--junitxml` reports carry it), and added as a note to the exception of a failure raised
inside `Seed.shown_on_failure()`, so it is in the failure's own message too.

What a seed fixes is everything the test draws from it; what the server does in between (timings, the
interleaving of concurrent requests) it cannot fix. A replay runs the same operations in the same order,
which is usually enough to hit the same bug again, but is not a guarantee for a race.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

ENV = "THREADLOOM_TEST_SEED"


def chosen() -> int:
    """The seed of this run: `THREADLOOM_TEST_SEED` if set (a decimal integer), else a fresh one."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return secrets.randbits(32)
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(f"{ENV} must be a decimal integer, not {text!r}") from None


@dataclass(frozen=True, slots=True)
class Seed:
    value: int
    nodeid: str

    @property
    def replay(self) -> str:
        """The command line, run from the repository's root, that runs this test again with this seed."""
        return f"{ENV}={self.value} .venv/bin/pytest {shlex.quote(self.nodeid)}"

    def random(self, salt: str = "") -> random.Random:
        """A generator drawn from the seed alone (and `salt`, for independent streams of one test)."""
        return random.Random(f"{self.value}:{salt}")

    def __str__(self) -> str:
        return f"random seed {self.value}; replay with: {self.replay}"

    @contextlib.contextmanager
    def shown_on_failure(self) -> Iterator[None]:
        """A failure raised inside names the seed and the replay command in its own message."""
        try:
            yield
        except Exception as error:
            error.add_note(str(self))
            raise


def draw(request: pytest.FixtureRequest, value: int | None = None) -> Seed:
    """The seed of the requesting test (`value`, or `chosen()`), printed and recorded as a property."""
    seed = Seed(chosen() if value is None else value, request.node.nodeid)
    request.node.user_properties.append((ENV, seed.value))
    print(seed)
    return seed
