"""Benchmark: the worst documents for parsing and validation, and how long each holds the event loop.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/validation_worst.py [--repeat 5] [--smoke]

Each document goes through the schema as a request does (`schema.execute`: parse, the
`api.bounds` pre-check, validation inline or on the validation pool, execution when it passes)
while a ticker task on the same event loop wakes every millisecond; the longest gap between
two ticks is how long the loop was held. The floor is `{ viewer { scope } }`. For each document
it prints the verdict (the first error code, or "ok"), the gap, and the time spent by the
pre-check (`bounds.measure`) and a full validation (`validate`) on their own.

Documents longer than 1 KiB, or with more than 32 fields or written selections, are parsed (the long
ones), pre-checked and validated in the validation process (`api.validation_process`), so the loop only
waits for the verdict; a long document that passes comes back pickled and is read on the loop (the
longest part of its hold). The worst documents kept inline (1 KiB of tokens, 32 nodes) are measured
too. The last lines give the longest hold seen over every run of every document, and over runs of the
worst documents sent two at a time, next to the floor's: the figure docs/security.md quotes. The
garbage collector is settled as the server settles it (`app.settle_garbage_collector`). The validation
process is started before the first measurement (its start takes about a second, off the loop).

`--smoke` runs each document once, for tests/test_bench_smoke.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from graphql import parse, validate

from threadloom.api import bounds
from threadloom.api.schema import build_schema
from threadloom.api.validation import all_rules
from threadloom.app import settle_garbage_collector
from threadloom.config import Limits

BODY = 256 * 1024


def fragment_bomb(levels: int = 25) -> str:
    fragments = " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(levels - 1))
    return f"query {{ ...F0 }} {fragments} fragment F{levels - 1} on Query {{ viewer {{ scope }} }}"


def _fan_out(width: int) -> str:
    """Three levels of `width` distinct (unknown) fields through fragments: width + width² + width³ fields
    expanded, no response name twice, so only the expanded-fields limit bounds it."""
    level = " ".join(f"c{i}" for i in range(width))
    middle = " ".join(f"b{i} {{ ...L }}" for i in range(width))
    top = " ".join(f"a{i} {{ ...M }}" for i in range(width))
    return f"{{ {top} }} fragment M on Query {{ {middle} }} fragment L on Query {{ {level} }}"


def documents() -> dict[str, str]:
    leaf_dups = bounds.MAX_OVERLAP  # the most leaf copies the overlap limit lets through: m²/2 ≤ MAX_OVERLAP
    most_leaves = int((2 * leaf_dups) ** 0.5)
    most_pairs = int((leaf_dups / 2) ** 0.5)  # viewer { scope } copies: (2m)²/2 ≤ MAX_OVERLAP
    names = ""
    i = 0
    while len(names) < BODY - 64:
        names += f" f{i}"
        i += 1
    width = 1
    while width + width**2 + (width + 1) ** 3 <= bounds.MAX_EXPANDED_FIELDS:
        width += 1
    fragments = ""  # unused fragments: each validated, none expanded
    k = 0
    while len(fragments) < bounds.INLINE_QUERY_CHARS - 80:
        fragments += f" fragment U{k} on Query {{ viewer {{ scope }} }}"
        k += 1
    operations = " ".join(f"query Q{i} {{ viewer {{ scope }} }}" for i in range(620))  # ~4,960 tokens
    written = (bounds.INLINE_NODES - 3) // 3  # the most unused fragments that stay inline (3 nodes each)
    dups = min(bounds.INLINE_FIELDS, bounds.INLINE_NODES - 1) - 1  # the most copies of scope kept inline
    return {
        "floor { viewer { scope } }": "{ viewer { scope } }",
        f"inline parse: {bounds.INLINE_QUERY_CHARS} chars of tokens": "{ viewer {"
        + " a" * ((bounds.INLINE_QUERY_CHARS - 14) // 2)
        + " } }",
        f"inline: {dups} duplicate fields": "{ viewer {" + " scope" * dups + " } }",
        f"inline: {written} unused fragments": "query { viewer { scope } }"
        + "".join(f" fragment U{i} on Query {{ viewer {{ scope }} }}" for i in range(written)),
        f"{k} unused fragments (1 KiB)": "query { viewer { scope } }" + fragments,
        "620 operations (token limit)": operations,
        f"fan-out {width}x{width}x{width} (expanded-fields limit)": _fan_out(width),
        "fragment bomb (25 levels, 884 chars)": fragment_bomb(),
        "1,240 duplicate fields": "{ viewer {" + " scope" * 1240 + " } }",
        f"{most_leaves} duplicate fields (overlap limit)": "{ viewer {" + " scope" * most_leaves + " } }",
        f"{most_pairs} x viewer {{ scope }} (overlap limit)": "{" + " viewer { scope }" * most_pairs + " }",
        "500 distinct unknown fields (width limit)": "{ viewer {" + "".join(f" f{i}" for i in range(500)) + " } }",
        "1,240 aliases": "{ viewer {" + "".join(f" a{i}: scope" for i in range(1240)) + " } }",
        "deep: 1,200 nested inline fragments": "{" + " ... on Query {" * 1200 + " viewer { scope }" + " }" * 1201,
        "deep: 2,000 chained fragments": "query { ...F0 } "
        + " ".join(f"fragment F{i} on Query {{ ...F{i + 1} }}" for i in range(1999))
        + " fragment F1999 on Query { viewer { scope } }",
        "256 KiB of distinct fields (tokens)": "{ viewer {" + names + " } }",
        "256 KiB comment": "#" + "x" * (BODY - 64) + "\n{ viewer { scope } }",
        "256 KiB string argument": '{ node(id: "' + "x" * (BODY - 64) + '") { id } }',
    }


async def held(schema: Any, query: str, together: int = 1) -> tuple[float, str]:
    """(the longest gap between ticks of a 1 ms ticker while the query ran `together` times at once,
    the first error code)."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.005)
    gaps.clear()
    result, *_ = await asyncio.gather(*(schema.execute(query) for _ in range(together)))
    done.set()
    await task
    errors = result.errors or []
    code = str((errors[0].extensions or {}).get("code", errors[0].message[:40])) if errors else "ok"
    # Without a request context a valid document fails in its first resolver: it passed validation.
    return max(gaps, default=0.0), "valid" if code in ("ok", "INTERNAL_SERVER_ERROR") else code


def timed(function: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.suppress(Exception):  # a parse or recursion error is a measured outcome too
            function()
        best = min(best, time.perf_counter() - start)
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    repeat = 1 if args.smoke else args.repeat
    logging.disable(logging.CRITICAL)  # the resolvers' errors without a request context
    limits = Limits()
    schema = build_schema(limits)
    rules = all_rules(limits)
    settle_garbage_collector()  # as the server does: full collections would otherwise be the longest holds
    await schema.execute(documents()["256 KiB comment"])  # starts the validation process
    header = f"{'document':52s} {'chars':>7s} {'verdict':>22s} {'held med':>9s} {'held max':>9s} {'x floor':>8s}"
    print(f"{header} {'pre-check':>10s} {'validate':>10s}")
    floor = floor_max = 0.0
    worst = (0.0, "")  # the longest single hold, and its document
    for name, query in documents().items():
        gaps = []
        code = ""
        for _ in range(repeat):
            gap, code = await held(schema, query)
            gaps.append(gap)
        gap = statistics.median(gaps)
        try:
            document = parse(query, max_tokens=limits.max_tokens)
        except Exception:
            check = full = float("nan")
        else:
            check = timed(lambda: bounds.check(document), repeat)  # noqa: B023
            full = timed(lambda: validate(schema._schema, document, rules), repeat)  # noqa: B023
        if floor == 0.0:
            floor, floor_max = gap, max(gaps)
        else:
            worst = max(worst, (max(gaps), name))
        shown = f"{gap * 1000:7.1f}ms {max(gaps) * 1000:7.1f}ms {max(gaps) / floor_max:7.2f}x"
        print(f"{name:52s} {len(query):7d} {code:>22s} {shown} {check * 1000:8.2f}ms {full * 1000:8.1f}ms")
    pairs = (0.0, "")
    for name in ("256 KiB comment", "256 KiB string argument", "256 KiB of distinct fields (tokens)"):
        for _ in range(repeat):
            gap, _code = await held(schema, documents()[name], together=2)
            pairs = max(pairs, (gap, name))
    interval = sys.getswitchinterval() * 1000
    floor_text = f"{floor * 1000:.1f} ms (median), {floor_max * 1000:.1f} ms (longest)"
    print(f"floor: the loop held {floor_text} by {{ viewer {{ scope }} }} (1 ms ticker)")
    print(f"ratio {max(worst[0], pairs[0]) / floor_max:.2f}x (the longest hold over the floor's longest)")
    print(f"longest hold, one document at a time: {worst[0] * 1000:.1f} ms ({worst[1]})")
    print(f"longest hold, two at once: {pairs[0] * 1000:.1f} ms ({pairs[1]})")
    print(f"switch interval {interval:g} ms; collector settled as the server's")
    schema.validation.close()


if __name__ == "__main__":
    asyncio.run(main())
