"""How sure a benchmark's ratio is, and the verdict on a target that this allows.

A ratio is the median of per-round ratios; its spread is a distribution-free confidence interval
of that median, from the order statistics of the rounds (no assumption about the noise's shape,
no random resampling: every rank computes the same interval from the same times). A target is
``met`` or ``missed`` only when the whole interval lies on one side of it; an interval across it
is ``within noise``, and so is any ratio from fewer rounds than a 90 % interval needs. A ``--quick``
run is a smoke test: every target of its tables reads ``not judged``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Sequence

__all__ = [
    "CONFIDENCE",
    "MET",
    "MIN_ROUNDS",
    "MISSED",
    "NOT_JUDGED",
    "WITHIN_NOISE",
    "Progress",
    "Spread",
    "judge",
    "spread_of",
]

CONFIDENCE = 0.90
MET, MISSED, WITHIN_NOISE = "met", "missed", "within noise"
NOT_JUDGED = "not judged"  # the verdict of every target in a --quick run


def _tail(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / (1 << n)


def _coverage(n: int, k: int) -> float:
    """The confidence that the median lies in [x_(k), x_(n+1-k)] (1-based order statistics)."""
    return 1 - 2 * _tail(n, k - 1)


# The fewest rounds whose widest interval, [min, max], reaches CONFIDENCE: 5 (93.75 %).
MIN_ROUNDS = next(n for n in range(1, 64) if _coverage(n, 1) >= CONFIDENCE)


@dataclasses.dataclass(frozen=True)
class Spread:
    """The median of ``rounds`` samples and an interval that holds the true median with
    ``confidence`` (0 when too few rounds give no such interval: then it is the samples' range)."""

    median: float
    low: float
    high: float
    rounds: int
    confidence: float

    def text(self, unit: str = "x", digits: int = 2) -> str:
        """``1.08x [1.02-1.15]``: the median [the interval]."""
        return f"{self.median:.{digits}f}{unit} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def spread_of(samples: Sequence[float], confidence: float = CONFIDENCE) -> Spread:
    """The median and the narrowest order-statistic interval with at least ``confidence``."""
    if not samples:
        raise ValueError("no samples")
    ordered, n = sorted(samples), len(samples)
    k = 1
    while k + 1 <= (n + 1) // 2 and _coverage(n, k + 1) >= confidence:
        k += 1
    reached = _coverage(n, k)
    return Spread(
        statistics.median(ordered), ordered[k - 1], ordered[n - k], n, reached if reached >= confidence else 0.0
    )


def judge(spread: Spread, at_most: float | None = None, at_least: float | None = None) -> str:
    """``met``, ``missed`` or ``within noise``: a verdict only from an interval of the full confidence
    that lies wholly on one side of the bound (one noisy round never decides)."""
    if spread.confidence < CONFIDENCE:
        return WITHIN_NOISE
    if at_most is not None:
        return MET if spread.high <= at_most else MISSED if spread.low > at_most else WITHIN_NOISE
    if at_least is not None:
        return MET if spread.low >= at_least else MISSED if spread.high < at_least else WITHIN_NOISE
    raise ValueError("a target needs at_most or at_least")


class Progress:
    """Short progress lines on stderr, at most one every ``every`` seconds, and the last one."""

    def __init__(self, prefix: str, every: float = 2.0, enabled: bool = True) -> None:
        self.prefix, self.every, self.enabled = prefix, every, enabled
        self._last = -math.inf

    def say(self, message: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.every):
            self._last = now
            print(f"[bench] {self.prefix}{message}", file=sys.stderr, flush=True)
