"""What a model call costs, and a day's cap on it: the one price table, the one way to price a
call, and the UTC day's budget, shared by the memory curator and the agent (its relay).

All pure: `now` (epoch seconds) and the day's spending come in as arguments. The tokens are the
proxy's reported usage, or, before a call, an estimate. A model the table does not know is priced
as the most expensive one it does know, so an unknown name can only make a budget stricter; it is
logged once. A call goes out only if today's spending plus the call's worst case stays within the
budget, so the day's spending never goes over it, as far as the estimate holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dates import DAY
from .logs import get_logger

log = get_logger(__name__)

# USD per million tokens (input, output), by model-name prefix; the longest matching prefix wins.
PRICES: dict[str, tuple[float, float]] = {
    "claude-haiku": (1.0, 5.0),  # Haiku 4.5, the default curator
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    "claude-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus": (15.0, 75.0),
    "claude-3-opus": (15.0, 75.0),
}
MOST_EXPENSIVE = max(PRICES.values(), key=lambda p: p[0] + p[1])
# Prompt caching, as multiples of the input price: writing the cache costs more, reading it far less.
CACHE_WRITE, CACHE_READ = 1.25, 0.1

_warned: set[str] = set()


def prices(model: str) -> tuple[float, float]:
    """(input, output) USD per million tokens for `model`."""
    known = [prefix for prefix in PRICES if model.startswith(prefix)]
    if known:
        return PRICES[max(known, key=len)]
    if model not in _warned:
        _warned.add(model)
        log.warning("model_unpriced", model=model, priced_as=MOST_EXPENSIVE, hint="add it to spending.py PRICES")
    return MOST_EXPENSIVE


def cost_usd(model: str, input_tokens: int, output_tokens: int, cache_write_tokens: int = 0,
             cache_read_tokens: int = 0) -> float:
    price_in, price_out = prices(model)
    cached = cache_write_tokens * CACHE_WRITE + cache_read_tokens * CACHE_READ
    return ((input_tokens + cached) * price_in + output_tokens * price_out) / 1_000_000


def day_start(now: float) -> float:
    """When the UTC day holding `now` began."""
    return now - now % DAY


@dataclass(frozen=True)
class Decision:
    allowed: bool
    spent: float  # today's spending so far, USD
    estimate: float  # the call's worst case, USD
    resumes_at: float | None  # refused: when the next UTC day begins


@dataclass(frozen=True)
class DailyBudget:
    daily_usd: float

    def check(self, now: float, spent: float, estimate: float) -> Decision:
        """May a call whose worst case costs `estimate` go out, when today's calls cost `spent`?"""
        allowed = spent + estimate <= self.daily_usd
        return Decision(allowed, spent, estimate, None if allowed else day_start(now) + DAY)

    def report(self, now: float, spent: float, resumes_at: float | None) -> dict[str, Any]:
        """What /healthz and `memory status` show. `resumes_at`: the wait announced, if any; one
        that has passed (a new day not acted on yet) is no longer a wait."""
        waiting = resumes_at is not None and now < resumes_at
        return {"daily_usd": self.daily_usd, "spent_today_usd": round(spent, 6), "waiting": waiting,
                "resumes_at": resumes_at if waiting else None}
