"""What /metrics and tracing cost on the hot paths, per call, against a floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/metrics_overhead.py [--number 200000] [--smoke]

Each hook is the call the server makes (api/gate.py per HTTP request, api/errors.py per operation,
api/cohorts.py per event and cohort, a `tracing.span` while tracing is off), timed in-process with
`timeit` (best of 5 repeats). The floor, measured in the same run, counts the same things with plain
Python: a dict of counters keyed by the label values and a bucket list for the latency, which is the
least any counting could do. The server's own cost per request and per event is in bench/query_page.py
and bench/fanout.py; the last line puts a request's hooks beside a page's typical cost (docs/performance.md).

`--smoke` runs 2,000 calls per hook (a second, for tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import bisect
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

from threadloom import metrics, tracing  # noqa: E402

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_CPU_US = 7_000.0  # about the server CPU of one threads(first: 100) page (bench/query_page.py)


def per_call_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def threadloom_hooks() -> dict[str, Callable[[], object]]:
    def request() -> None:  # api/gate.py, after each HTTP request
        label = metrics.operation_label("Threads")
        metrics.REQUESTS.labels(label, "200").inc()
        metrics.REQUEST_SECONDS.labels(label).observe(0.0123)

    def operation() -> None:  # api/errors.py, each executed operation
        metrics.OPERATIONS.labels(metrics.operation_label("Threads"), "query").inc()

    def event() -> None:  # api/cohorts.py, each event of a cohort
        metrics.DELIVERED_FAST.inc(10)

    def span() -> None:  # any traced place while tracing is off
        with tracing.span("threadloom.bench"):
            pass

    return {"request": request, "operation": operation, "event": event, "span (tracing off)": span}


def floor_hooks() -> dict[str, Callable[[], object]]:
    counts: dict[tuple[str, ...], float] = {}
    latency: dict[str, list[int]] = {}
    names: set[str] = set()

    def label(name: str) -> str:
        if name not in names:
            names.add(name)
        return name

    def request() -> None:
        name = label("Threads")
        key = ("requests", name, "200")
        counts[key] = counts.get(key, 0) + 1
        buckets = latency.setdefault(name, [0] * (len(BUCKETS) + 1))
        buckets[bisect.bisect_left(BUCKETS, 0.0123)] += 1

    def operation() -> None:
        key = ("operations", label("Threads"), "query")
        counts[key] = counts.get(key, 0) + 1

    def event() -> None:
        key = ("events", "delivered", "fast")
        counts[key] = counts.get(key, 0) + 10

    def span() -> None:
        pass

    return {"request": request, "operation": operation, "event": event, "span (tracing off)": span}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=200_000, help="calls per hook and repeat")
    parser.add_argument("--smoke", action="store_true", help="2,000 calls per hook, for the test suite")
    args = parser.parse_args()
    number = 2_000 if args.smoke else args.number
    assert not tracing.ENABLED, "run without OTEL_TRACES_EXPORTER: this measures tracing while it is off"

    ours = {name: per_call_us(fn, number) for name, fn in threadloom_hooks().items()}
    floor = {name: per_call_us(fn, number) for name, fn in floor_hooks().items()}
    print(f"{'hook':<20} {'threadloom':>12} {'floor':>10}   ratio")
    for name in ours:
        print(f"{name:<20} {ours[name]:>9.2f} µs {floor[name]:>7.2f} µs   {ours[name] / max(floor[name], 1e-3):5.1f}x")
    total, total_floor = sum(ours.values()), sum(floor.values())
    print(f"ratio {total / total_floor:.1f}x (all hooks, threadloom over floor: {total:.2f} vs {total_floor:.2f} µs)")
    per_request = ours["request"] + ours["operation"]
    share = per_request / REQUEST_CPU_US
    print(f"share: {per_request:.1f} µs per request is {share:.3%} of the ~{REQUEST_CPU_US / 1000:.0f} ms a page costs")

if __name__ == "__main__":
    main()
