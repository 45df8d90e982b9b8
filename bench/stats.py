"""Small statistics helpers: percentiles and summaries of timing samples, paired comparisons."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any


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


def bootstrap_median_ci(values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0,
                        groups: Sequence[int] | None = None) -> tuple[float, float]:
    """A percentile-bootstrap confidence interval for the median of `values` (seeded: a rerun on
    the same samples reads the same). `groups`: each value's group (the server instances it came
    from): whole groups are drawn first, then values within each, so that what differs between
    groups (one instance running slower than its twin all along) widens the interval as it should."""
    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    by_group: dict[int, list[float]] = {}
    for value, group in zip(values, groups if groups is not None else [0] * len(values), strict=True):
        by_group.setdefault(group, []).append(value)
    clusters = list(by_group.values())

    def draw() -> list[float]:
        chosen = rng.choices(clusters, k=len(clusters)) if len(clusters) > 1 else clusters
        return [x for c in chosen for x in rng.choices(c, k=len(c))]

    medians = sorted(statistics.median(draw()) for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    return percentile(medians, tail), percentile(medians, 100 - tail)


def paired(a_s: Sequence[float], b_s: Sequence[float], groups: Sequence[int] | None = None) -> dict[str, Any]:
    """Two paths timed in the same rounds (a_s[i] and b_s[i] side by side, seconds): the median
    of the per-round ratios a/b and differences a-b, each with its 95% bootstrap interval (by
    `groups`, see bootstrap_median_ci). Pairing takes the machine's drift, which moves both turns
    of a round alike, out of the comparison."""
    if len(a_s) != len(b_s) or (groups is not None and len(groups) != len(a_s)):
        raise ValueError("paired samples must have the same length")
    ratios = [a / b for a, b in zip(a_s, b_s, strict=True)]
    diffs_ms = [(a - b) * 1000 for a, b in zip(a_s, b_s, strict=True)]
    r_lo, r_hi = bootstrap_median_ci(ratios, groups=groups)
    d_lo, d_hi = bootstrap_median_ci(diffs_ms, groups=groups)
    return {"ratio": round(statistics.median(ratios), 4), "ratio_ci95": [round(r_lo, 4), round(r_hi, 4)],
            "diff_ms": round(statistics.median(diffs_ms), 2), "diff_ci95_ms": [round(d_lo, 2), round(d_hi, 2)],
            "pairs": len(ratios)}
