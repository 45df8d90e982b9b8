"""Stored times as text, whatever number a row holds.

A turn's or a learning's time is a REAL in SQLite, and an older import or a hand-made row may
hold anything: 1e30 makes `time.gmtime` raise OverflowError, 1e17 OSError(75), and either one
row used to stop a search, auto-recall or the boot prompt. Here a time no calendar can show
reads as UNKNOWN, and code that ranks by time can ask `usable` first.
"""

from __future__ import annotations

import math
import time

# The years datetime and gmtime can both show (1 to 9999), in epoch seconds.
FIRST = -62_135_596_800.0
LAST = 253_402_300_799.0
UNKNOWN = "unknown date"
DAY = 86_400.0  # UTC days: epoch time has no leap seconds, so every day starts at a multiple of this


def usable(ts: float | None) -> bool:
    """True if `ts` is a time some calendar day holds."""
    return ts is not None and isinstance(ts, (int, float)) and math.isfinite(ts) and FIRST <= ts <= LAST


def utc(ts: float | None, fmt: str = "%Y-%m-%d", unknown: str = UNKNOWN) -> str:
    """`ts` as UTC text in `fmt`, or `unknown` when no calendar day holds it."""
    if not usable(ts):
        return unknown
    assert ts is not None
    try:
        return time.strftime(fmt, time.gmtime(ts))
    except (OverflowError, OSError, ValueError):  # a platform whose time_t is narrower
        return unknown
