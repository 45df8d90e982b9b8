"""Calendar facts about stored times, whatever number a row holds.

A turn's or a learning's time is a REAL in SQLite, and an older import or a hand-made row may
hold anything: 1e30 makes `time.gmtime` raise OverflowError, 1e17 OSError(75). Showing such a
time is text.utc's ("?"); code that ranks or filters by time asks `usable` first.
"""

from __future__ import annotations

import math

# The years datetime and gmtime can both show (1 to 9999), in epoch seconds.
FIRST = -62_135_596_800.0
LAST = 253_402_300_799.0
DAY = 86_400.0  # UTC days: epoch time has no leap seconds, so every day starts at a multiple of this


def usable(ts: float | None) -> bool:
    """True if `ts` is a time some calendar day holds."""
    return ts is not None and isinstance(ts, (int, float)) and math.isfinite(ts) and FIRST <= ts <= LAST

