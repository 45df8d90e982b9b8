"""The curator's daily budget, as pure code: may this call go out, given what today cost?

Nothing here reads a clock or a database: `now` (epoch seconds) and the day's
spending come in as arguments. A day is the UTC day. A call goes out only if
today's spending plus the call's worst case (its estimated input, and a reply
as long as the cap allows) stays within the budget, so the day's spending never
goes over it, as far as the estimate holds. When the budget is spent, batches
wait for the next UTC day: that is no failure, so it runs no failing clock and
marks nothing stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ...config import DEFAULT_DAILY_USD
from ...dates import DAY

BUDGET_KEY = "daemon_budget"  # memory.db meta: the running daemon's budget and its wait, for `memory status`


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
    daily_usd: float = DEFAULT_DAILY_USD

    def check(self, now: float, spent: float, estimate: float) -> Decision:
        """May a call whose worst case costs `estimate` go out, when today's calls cost `spent`?"""
        allowed = spent + estimate <= self.daily_usd
        return Decision(allowed, spent, estimate, None if allowed else day_start(now) + DAY)

    def report(self, now: float, spent: float, resumes_at: float | None) -> dict[str, Any]:
        """What /healthz and `memory status` show. `resumes_at`: the wait the daemon announced, if
        any; one that has passed (a new day the daemon has not acted on yet) is no longer a wait."""
        waiting = resumes_at is not None and now < resumes_at
        return {"daily_usd": self.daily_usd, "spent_today_usd": round(spent, 6), "waiting": waiting,
                "resumes_at": resumes_at if waiting else None}


class BudgetRecord(msgspec.Struct):
    """The daemon's budget as memory.db keeps it, so `memory status` (another process, maybe
    another environment) shows the budget the server runs with, and its wait."""

    daily_usd: float
    resumes_at: float | None = None

    def dumps(self) -> str:
        return msgspec.json.encode(self).decode()

    @staticmethod
    def loads(raw: str | None) -> BudgetRecord | None:
        """None when there is none, or it is unreadable (then the caller's own setting stands)."""
        if not raw:
            return None
        try:
            return msgspec.json.decode(raw, type=BudgetRecord)
        except msgspec.MsgspecError:
            return None
