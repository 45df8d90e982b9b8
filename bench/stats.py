"""Small statistics helpers: percentiles and summaries of timing samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), by linear interpolation between closest ranks."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """Seconds in, milliseconds out: median, p95, p99, n."""
    ms = [s * 1000 for s in samples_s]
    return {"median_ms": round(statistics.median(ms), 3), "p95_ms": round(percentile(ms, 95), 3),
            "p99_ms": round(percentile(ms, 99), 3), "n": len(ms)}


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else math.nan
