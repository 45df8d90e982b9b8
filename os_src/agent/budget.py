"""The agent's budget, as pure code: may this call to the model go out?

The relay (agent/model_relay.py) asks before it forwards any of the agent's calls, with the key it
holds: the agent can make such calls itself (`curl` with the relay's key), so the CLI's own settings
bind nothing. A call is refused when
- its model is not one the Sprite allows (the agent's model, the small one the CLI uses for side
  jobs, and what the person adds in SPRITE_AGENT_MODELS);
- it asks for more output than the ceiling (SPRITE_AGENT_MAX_TOKENS; the CLI is told the same);
- its cost is not bounded by its bytes and max_tokens (an input by URL, a server tool, a premium
  tier or beta: read_call), or it names a key twice (the proxy might read the other);
- it is one too many for the minute (SPRITE_AGENT_REQUESTS_PER_MINUTE): a 429 with `retry-after`,
  which the CLI waits out and retries;
- today's spending, with what calls in flight may still cost, plus this call's worst case (its
  estimated input, and a reply as long as it asks for) would pass the day's cap
  (SPRITE_AGENT_DAILY_BUDGET_USD), as for the curator (spending.DailyBudget). That refusal is
  final for the day: the CLI is told not to retry, and the turn says why.

Nothing here reads a clock, a file or a socket: `now` and the day's state come in as arguments.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import msgspec

from ..config import Settings
from ..dates import DAY
from ..spending import DailyBudget, cost_usd, day_start
from ..text import CHARS_PER_TOKEN

CALL_RATE_WINDOW = 60.0  # the rate is counted over any such span
REFUSED_BY = "Sprite OS refused the agent's call:"  # every refusal begins so: the turn's error names the Sprite

Reason = Literal["model", "max_tokens", "rate", "budget", "invalid", "unbounded"]


@dataclass(frozen=True)
class AgentLimits:
    models: frozenset[str]  # the names a call may ask for, exactly
    daily_usd: float
    max_tokens: int
    per_minute: int
    window: float = CALL_RATE_WINDOW  # seconds in which `per_minute` calls may go (a minute; tests shorten it)

    @classmethod
    def of(cls, settings: Settings) -> AgentLimits:
        return cls(settings.agent_models(), settings.agent_daily_budget_usd, settings.agent_max_tokens,
                   settings.agent_requests_per_minute)


# The betas the bundled CLI sends (seen at the mock Bridge), and others that bill nothing beyond the
# body and the reply; any other (context-1m prices long inputs higher, fast-mode every token,
# extended-cache-ttl a cache write at twice the input, files-api, mcp and server tools bill what no
# body shows) is refused.
ALLOWED_BETAS = frozenset({
    "claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27",
    "per-turn-control-2026-07-01", "mid-conversation-tool-changes-2026-07-01", "thinking-token-count-2026-05-13",
    "effort-2025-11-24", "thinking-display-updates-2026-08-18", "prompt-caching-scope-2026-01-05",
    "structured-outputs-2025-12-15", "token-counting-2024-11-01", "redact-thinking-2026-02-12",
    "fine-grained-tool-streaming-2025-05-14"})
UNBOUNDED_SOURCES = frozenset({"url", "file"})  # fetched or stored by the API: their size is not in the body


class _Source(msgspec.Struct):
    type: str | None = None


class _Block(msgspec.Struct):
    """A content block, as far as its cost goes: inputs by reference, and blocks nested in it."""

    type: str | None = None
    source: _Source | str | None = None  # a search result's source is its URL, as text: its content is inline
    file_id: str | None = None
    content: str | list[_Block] | None = None


class _Message(msgspec.Struct):
    content: str | list[_Block] = ""


class _Tool(msgspec.Struct):
    type: str | None = None  # None or "custom": the agent's own; any other is one of the API's (web_search...)
    name: str = ""


class CallFacts(msgspec.Struct):
    """What the relay reads of a Messages API body (the rest is skipped, never decoded)."""

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    messages: list[_Message] = []
    system: str | list[_Block] | None = None
    tools: list[_Tool] = []
    mcp_servers: list[msgspec.Raw] | None = None
    container: msgspec.Raw | None = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None


@dataclass(frozen=True)
class Call:
    counts_tokens: bool  # /v1/messages/count_tokens: free, no reply
    model: str
    max_tokens: int
    body_bytes: int

    def worst_case_usd(self) -> float:
        """What it may cost at most, as far as the estimate holds: its input (written to the cache,
        the dearest way), and a reply as long as it asked for."""
        if self.counts_tokens:
            return 0.0
        input_tokens = math.ceil(self.body_bytes / CHARS_PER_TOKEN)
        return cost_usd(self.model, 0, self.max_tokens, cache_write_tokens=input_tokens)


@dataclass(frozen=True)
class Refusal:
    reason: Reason
    status: int
    message: str
    retry_after: float | None = None  # seconds; set when a retry can succeed (the rate)

    @property
    def retry(self) -> bool:
        return self.retry_after is not None


def read_call(body: bytes | bytearray, counts_tokens: bool, betas: Sequence[bytes] = ()) -> Call | Refusal:
    """The call a request body (and its `anthropic-beta` headers) makes, or why the relay does not
    forward it: "invalid", not a Messages API request; "unbounded", one whose cost its bytes and
    max_tokens do not bound (an input by URL, a server tool, a premium tier). Both final: 400."""
    def refusal(reason: Reason, why: str) -> Refusal:
        return Refusal(reason, 400, f"{REFUSED_BY} {why}")

    if (unbounded := unbounded_betas(betas)) is not None:
        return refusal("unbounded", unbounded)
    try:
        json.loads(body, object_pairs_hook=_unique_keys)  # the proxy must read what the budget read
        facts = msgspec.json.decode(body, type=CallFacts)
    except _DuplicateKey as exc:
        return refusal("invalid", f"the request body names {str(exc)[:100]!r} twice in one object")
    except (ValueError, msgspec.ValidationError, RecursionError) as exc:  # json's and msgspec's DecodeError too
        return refusal("invalid", f"the request body is not a Messages API request: {str(exc)[:200]}")
    if not facts.model:
        return refusal("invalid", "the request names no model")
    if not counts_tokens and (facts.max_tokens is None or facts.max_tokens < 1):
        return refusal("invalid", "the request sets no max_tokens")
    if (unbounded := unbounded_by_body(facts)) is not None:
        return refusal("unbounded", unbounded)
    return Call(counts_tokens, facts.model, facts.max_tokens or 0, len(body))


def unbounded_betas(values: Sequence[bytes]) -> str | None:
    """Why these `anthropic-beta` header values make a call cost more than its body shows, if they do."""
    for value in values:
        for beta in value.decode("latin-1").split(","):
            if (name := beta.strip()) and name not in ALLOWED_BETAS:
                return (f"the beta {name[:100]!r} may bill beyond what the request shows, and the agent's budget "
                        "could not bound it (the betas the CLI sends are allowed)")
    return None


def unbounded_by_body(facts: CallFacts) -> str | None:
    """Why this body makes a call cost more than its bytes and max_tokens bound, if it does."""
    tail = "and the agent's budget could not bound its cost"
    for name in ("service_tier", "speed", "inference_geo"):
        if (value := getattr(facts, name)) is not None and not (name == "service_tier" and value == "standard_only"):
            return f"the request sets {name}={value[:50]!r}, which may bill at a premium, {tail}"
    if facts.mcp_servers is not None or facts.container is not None:
        return f"the request uses the API's MCP servers or code containers, {tail}"
    if server := next((t.type for t in facts.tools if t.type not in (None, "custom")), None):
        return f"the request offers the server tool {server[:100]!r} (billed per use, its results as input), {tail}"
    blocks = [*(facts.system if isinstance(facts.system, list) else ()),
              *(b for m in facts.messages if isinstance(m.content, list) for b in m.content)]
    while blocks:
        block = blocks.pop()
        if block.file_id is not None or (isinstance(block.source, _Source) and block.source.type in UNBOUNDED_SOURCES):
            return (f"the request gives an input ({block.type or 'a block'}) by URL or file id: its size is not "
                    f"in the request, {tail}")
        if isinstance(block.content, list):
            blocks += block.content
    return None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    """json's hook for each object: a key given twice is refused (JSON parsers differ on which one wins)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)


@dataclass(frozen=True)
class SpendDay:
    """The day's account: what its settled calls cost, and what calls in flight may still cost."""

    day: float  # day_start of the UTC day it counts
    spent: float = 0.0
    reserved: float = 0.0  # the worst case of calls in flight
    calls: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # by reason
    recent: tuple[float, ...] = ()  # when each call of the last CALL_RATE_WINDOW went out

    def on(self, now: float) -> SpendDay:
        """This account as of `now`: a new UTC day starts at 0 (calls in flight stay reserved)."""
        today = day_start(now)
        if today == self.day:
            return self
        return SpendDay(today, reserved=self.reserved, recent=self.recent)


def check(limits: AgentLimits, now: float, call: Call, account: SpendDay) -> Refusal | None:
    """Whether `call` may go out now (None), or why not."""
    if call.model not in limits.models:
        allowed = ", ".join(sorted(limits.models))
        return Refusal("model", 403, f"{REFUSED_BY} the model {call.model[:100]!r} is not allowed; the agent may "
                                     f"use {allowed} (SPRITE_AGENT_MODELS adds more)")
    if call.max_tokens > limits.max_tokens:
        return Refusal("max_tokens", 400, f"{REFUSED_BY} it asked for max_tokens={call.max_tokens}, and the "
                                          f"agent's replies are capped at {limits.max_tokens} (SPRITE_AGENT_MAX_TOKENS)")
    recent = [t for t in account.recent if now - t < limits.window]
    if len(recent) >= limits.per_minute:
        wait = max(1.0, math.ceil(min(recent) + limits.window - now))
        return Refusal("rate", 429, f"{REFUSED_BY} the agent may make {limits.per_minute} model calls in "
                                    f"{limits.window:g} s (SPRITE_AGENT_REQUESTS_PER_MINUTE); the next may go in "
                                    f"{wait:.0f} s",
                       retry_after=wait)
    day = account.on(now)
    decision = DailyBudget(limits.daily_usd).check(now, day.spent + day.reserved, call.worst_case_usd())
    if not decision.allowed:
        resets = time.strftime("%H:%M UTC", time.gmtime(day.day + DAY))
        return Refusal("budget", 429, f"{REFUSED_BY} its daily budget of ${limits.daily_usd:.2f} is spent "
                                      f"(${day.spent:.2f} today, and this call may cost up to "
                                      f"${decision.estimate:.2f}); it starts again at {resets} "
                                      "(SPRITE_AGENT_DAILY_BUDGET_USD)")
    return None


def reserve(limits: AgentLimits, account: SpendDay, now: float, call: Call) -> SpendDay:
    """The account once `call` went out: its worst case held until it is settled."""
    day = account.on(now)
    recent = (*(t for t in day.recent if now - t < limits.window), now)
    return replace(day, reserved=day.reserved + call.worst_case_usd(), recent=recent)


def settle(account: SpendDay, now: float, call: Call, cost: float) -> SpendDay:
    """The account once `call` ended, having cost `cost` (counted on the day it ends)."""
    day = account.on(now)
    reserved = max(0.0, day.reserved - call.worst_case_usd())
    return replace(day, spent=day.spent + cost, reserved=reserved, calls=day.calls + (not call.counts_tokens))


def refused(account: SpendDay, now: float, reason: Reason) -> SpendDay:
    day = account.on(now)
    return replace(day, refused={**day.refused, reason: day.refused.get(reason, 0) + 1})


def report(limits: AgentLimits, account: SpendDay, now: float) -> dict[str, Any]:
    """What /healthz, the console and `memory status` show."""
    day = account.on(now)
    return {"daily_usd": limits.daily_usd, "spent_today_usd": round(day.spent, 6),
            "in_flight_usd": round(day.reserved, 6), "calls_today": day.calls, "refused_today": dict(day.refused),
            "resets_at": day.day + DAY, "models": sorted(limits.models), "max_tokens": limits.max_tokens,
            "requests_per_minute": limits.per_minute}
