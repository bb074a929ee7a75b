"""Token buckets: how many mutations and run starts a token may make, and how long to wait.

Pure arithmetic on a monotonic clock reading; the API layer keeps one pair of buckets per token
in process memory. A refusal takes nothing from any bucket, so a refused request costs the
caller nothing and a retry after `retry_after` seconds succeeds (absent other traffic).
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True, slots=True)
class Rate:
    per_minute: int
    burst: int

    @property
    def per_second(self) -> float:
        return self.per_minute / 60.0


@dataclasses.dataclass(slots=True)
class Bucket:
    """`level` tokens available at monotonic time `at`; refills at the rate up to the burst."""

    level: float
    at: float

    @classmethod
    def full(cls, rate: Rate, now: float) -> Bucket:
        return cls(float(rate.burst), now)

    def refill(self, rate: Rate, now: float) -> None:
        if now > self.at:
            self.level = min(float(rate.burst), self.level + (now - self.at) * rate.per_second)
            self.at = now

    def wait_for(self, rate: Rate, amount: int) -> float:
        """Seconds until `amount` tokens are available (0: now). Call after `refill`."""
        if amount <= self.level:
            return 0.0
        if rate.per_minute <= 0:
            return math.inf
        return (amount - self.level) / rate.per_second


def take_all(charges: list[tuple[Bucket, Rate, int]], now: float) -> int:
    """Take every charge or none: 0 when taken, else the whole seconds to wait before retrying."""
    wait = 0.0
    for bucket, rate, amount in charges:
        bucket.refill(rate, now)
        if amount > 0:
            wait = max(wait, bucket.wait_for(rate, amount))
    if wait > 0:
        return max(1, math.ceil(wait)) if math.isfinite(wait) else 2**31 - 1
    for bucket, _rate, amount in charges:
        bucket.level -= amount
    return 0
