"""When a question is about: "last spring", "in March 2023", "about 4 months ago", "now", or a
time placed by another event: "the week before my sister's wedding".

Pure: takes the query and `now`, returns the period meant (or None) and whether the
query asks for the current state. The ranking keeps its lexical order within the period
first; the words of the expression are dropped from the lexical query. An event-relative time
(`anchor_cue`) names the event to search for; once its date is known, `Anchor.window` says the
period.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ...dates import DAY, usable

MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
SEASONS = {"winter": 12, "spring": 3, "summer": 6, "autumn": 9, "fall": 9}  # first month; three months each
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10, "eleven": 11, "twelve": 12, "a": 1, "a couple of": 2, "a few": 3}
SLACK = timedelta(days=3)

_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_SEASON = "|".join(SEASONS)
_NUM = r"\d{1,2}|" + "|".join(sorted(NUMBERS, key=len, reverse=True))
_PATTERNS = [
    ("month_year", re.compile(rf"\b(?:in |during |around |back in )?({_MONTH}),? ((?:19|20)\d\d)\b", re.I)),
    ("season_year", re.compile(rf"\b(?:in |during )?(?:the )?({_SEASON}) (?:of )?((?:19|20)\d\d)\b", re.I)),
    ("last_season", re.compile(rf"\b(?:last|this past) ({_SEASON})\b", re.I)),
    ("ago", re.compile(rf"\b(?:about |around |roughly )?({_NUM}) (month|week|year)s? ago\b", re.I)),
    ("last_unit", re.compile(r"\blast (week|month|year)\b", re.I)),
    ("month", re.compile(rf"\b(?:in|during|around|back in|early|late) ({_MONTH})\b", re.I)),
    ("year", re.compile(r"\b(?:in|during|back in) ((?:19|20)\d\d)\b", re.I)),
]
_NOW = re.compile(r"\b(now|currently|current|these days|at the moment|at present|presently|nowadays|latest|most recent(?:ly)?)\b", re.I)


@dataclass(frozen=True)
class When:
    start: float
    end: float
    text: str  # the expression, to drop from the lexical query


@dataclass(frozen=True)
class TimeCue:
    when: When | None
    current: bool  # the query asks for the latest state
    rest: str  # the query without the time expression


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    while month < 1:
        year, month = year - 1, month + 12
    while month > 12:
        year, month = year + 1, month - 12
    first = datetime(year, month, 1, tzinfo=UTC)
    return first, first + timedelta(days=calendar.monthrange(year, month)[1])


def _span(year: int, month: int, months: int) -> tuple[datetime, datetime]:
    return _month(year, month)[0], _month(year, month + months - 1)[1]


def _resolve(kind: str, m: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    if kind == "month_year":
        return _month(int(m[2]), MONTHS[m[1].lower()])
    if kind == "season_year":
        return _span(int(m[2]), SEASONS[m[1].lower()], 3)
    if kind == "last_season":
        first = SEASONS[m[1].lower()]
        for year in (now.year, now.year - 1, now.year - 2):
            start, end = _span(year, first, 3)
            if end <= now + SLACK:
                return start, end
        return None
    if kind == "ago":
        n = int(m[1]) if m[1].isdigit() else NUMBERS[m[1].lower()]
        unit = m[2].lower()
        if unit == "year":
            return _span(now.year - n, 1, 12)
        if unit == "week":
            centre = now - timedelta(weeks=n)
            return centre - timedelta(days=7), centre + timedelta(days=7)
        start, _ = _month(now.year, now.month - n - 1)
        _, end = _month(now.year, now.month - n + 1)
        return start, end
    if kind == "last_unit":
        unit = m[1].lower()
        if unit == "week":
            return now - timedelta(days=14), now
        if unit == "month":
            return _month(now.year, now.month - 1)
        return _span(now.year - 1, 1, 12)
    if kind == "month":
        month = MONTHS[m[1].lower()]
        year = now.year if _month(now.year, month)[0] <= now else now.year - 1
        return _month(year, month)
    if kind == "year":
        return _span(int(m[1]), 1, 12)
    return None


def time_cue(query: str, now: float) -> TimeCue:
    if not usable(now):  # no calendar holds it: nothing is read as a date
        return TimeCue(None, False, query)
    when_at = datetime.fromtimestamp(now, UTC)
    for kind, pattern in _PATTERNS:
        m = pattern.search(query)
        if m and (window := _resolve(kind, m, when_at)):
            start, end = window
            rest = (query[:m.start()] + " " + query[m.end():]).strip()
            return TimeCue(When((start - SLACK).timestamp(), (end + SLACK).timestamp(), m[0]), False, rest)
    current = _NOW.search(query)
    rest = (query[:current.start()] + " " + query[current.end():]).strip() if current else query
    return TimeCue(None, bool(current), rest)


# ---------------------------------------------------------------- a time placed by another event

# How long "the week", "the days"... before or after an event lasts, in days.
SPANS = {"day": 1, "days": 5, "few days": 5, "couple of days": 3, "weekend": 7, "week": 7, "couple of weeks": 14,
         "fortnight": 14, "month": 31, "just": 3, "right": 3, "shortly": 3, "": 10}
# When the event was, against the turn that told it: people tell of an event before it happens and after.
TOLD = 7.0
_ANCHOR = re.compile(
    r"\b(?:(?:in|during) )?(?:(?:the|a) )?(?P<span>few days|couple of days|couple of weeks|days?|weekend|week|fortnight"
    r"|month|just|right|shortly)?\s*(?P<rel>before|after|leading up to|following)\s+(?P<event>[^?.!,;]+)", re.I)


@dataclass(frozen=True)
class Anchor:
    event: str  # what to search for to date it ("my sister's wedding")
    before: bool
    days: float
    rest: str  # the query without the expression

    def window(self, told_at: float) -> When:
        """The period meant, given when the event was told of (within TOLD days of it, either way)."""
        if self.before:
            start, end = told_at - (self.days + TOLD) * DAY, told_at + TOLD * DAY
        else:
            start, end = told_at - TOLD * DAY, told_at + (self.days + TOLD) * DAY
        return When(start, end, self.event)


def anchor_cue(query: str) -> Anchor | None:
    """"What did I buy the week before Mags's wedding?": the event ("Mags's wedding"), which side, how
    long. None when the query places nothing by an event."""
    m = _ANCHOR.search(query)
    if m is None or not re.search(r"\w", m["event"]):
        return None
    span = (m["span"] or "").lower()
    rest = (query[:m.start()] + " " + query[m.end():]).strip()
    return Anchor(m["event"].strip(), m["rel"].lower() in ("before", "leading up to"), float(SPANS[span]), rest)
