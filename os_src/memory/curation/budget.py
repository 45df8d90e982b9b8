"""The curator's daily budget: the record `memory status` reads (the default is config's).

The policy is spending.DailyBudget (pure: may this call go out, given what today cost?). A call
goes out only if today's spending plus the call's worst case (its estimated input, and a reply as
long as the cap allows) stays within the budget. When the budget is spent, batches wait for the
next UTC day: that is no failure, so it runs no failing clock and marks nothing stale.
"""

from __future__ import annotations

import msgspec

BUDGET_KEY = "daemon_budget"  # memory.db meta: the running daemon's budget and its wait, for `memory status`


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
