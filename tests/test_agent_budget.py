"""The agent's budget: the pure policy (agent/budget.py), the usage read from replies
(agent/usage.py), and the day's account as the relay keeps it (agent/spend_book.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sprite_os.agent.budget import (
    REFUSED_BY,
    AgentLimits,
    Call,
    Refusal,
    SpendDay,
    check,
    read_call,
    report,
    reserve,
    settle,
)
from sprite_os.agent.spend_book import SpendBook, read_record, status_report
from sprite_os.agent.usage import MAX_USAGE_EVENT, UsageMeter
from sprite_os.config import ConfigError, load_settings
from sprite_os.dates import DAY
from sprite_os.spending import cost_usd

JAN_1_2030 = 1_893_456_000.0  # 2030-01-01 00:00:00 UTC
NOON = JAN_1_2030 + DAY / 2
LIMITS = AgentLimits(frozenset({"claude-sonnet-4-5", "claude-haiku-4-5"}), daily_usd=1.0, max_tokens=1000,
                     per_minute=3)
SONNET = Call(False, "claude-sonnet-4-5", 1000, 4000)  # 1,000 input tokens estimated, 1,000 out at most


def fresh(now: float = NOON) -> SpendDay:
    return SpendDay(0.0).on(now)


# ---------------------------------------------------------------- the policy


def test_an_allowed_call_within_everything_goes_out() -> None:
    assert check(LIMITS, NOON, SONNET, fresh()) is None


@pytest.mark.parametrize(("call", "reason", "status", "says"), [
    (replace(SONNET, model="claude-opus-4-1"), "model", 403, "the model 'claude-opus-4-1' is not allowed"),
    (replace(SONNET, max_tokens=1001), "max_tokens", 400, "max_tokens=1001, and the agent's replies are capped at 1000"),
])
def test_a_model_not_allowed_or_a_reply_over_the_ceiling_is_refused_for_good(
        call: Call, reason: str, status: int, says: str) -> None:
    refusal = check(LIMITS, NOON, call, fresh())
    assert refusal is not None and (refusal.reason, refusal.status) == (reason, status)
    assert refusal.message.startswith(REFUSED_BY) and says in refusal.message
    assert not refusal.retry  # the CLI must not retry it


def test_a_burst_over_the_rate_waits_until_the_oldest_call_leaves_the_window() -> None:
    account = fresh()
    for second in (0, 10, 20):
        assert check(LIMITS, NOON + second, SONNET, account) is None
        account = settle(account, NOON + second, SONNET, 0.001)
        account = reserve(LIMITS, account, NOON + second, SONNET)
    refusal = check(LIMITS, NOON + 30, SONNET, account)
    assert refusal is not None and refusal.reason == "rate" and refusal.status == 429
    assert refusal.retry and refusal.retry_after == 30  # the call at NOON leaves the minute at NOON + 60
    assert check(LIMITS, NOON + 60, SONNET, account) is None


def test_the_day_is_capped_with_what_calls_in_flight_may_still_cost() -> None:
    worst = SONNET.worst_case_usd()
    assert worst == pytest.approx(cost_usd("claude-sonnet-4-5", 0, 1000, cache_write_tokens=1000))
    account = replace(fresh(), spent=1.0 - 1.5 * worst)  # room for one worst case, not two
    assert check(LIMITS, NOON, SONNET, account) is None
    in_flight = reserve(LIMITS, account, NOON, SONNET)
    refusal = check(LIMITS, NOON, SONNET, in_flight)  # the first may still cost its worst
    assert refusal is not None and refusal.reason == "budget" and not refusal.retry
    assert "daily budget of $1.00 is spent" in refusal.message and "starts again at 00:00 UTC" in refusal.message
    done = settle(in_flight, NOON + 1, SONNET, 0.1 * worst)  # it cost far less than its worst
    assert check(LIMITS, NOON + 1, SONNET, done) is None


def test_the_next_utc_day_starts_afresh_but_calls_in_flight_stay_held() -> None:
    spent = reserve(LIMITS, replace(fresh(), spent=0.999), NOON, SONNET)
    assert check(LIMITS, NOON, SONNET, spent) is not None
    tomorrow = spent.on(JAN_1_2030 + DAY)
    assert (tomorrow.spent, tomorrow.reserved) == (0.0, spent.reserved)
    assert check(LIMITS, JAN_1_2030 + DAY, SONNET, tomorrow) is None
    ended = settle(tomorrow, JAN_1_2030 + DAY + 5, SONNET, 0.01)  # paid on the day it ended
    assert (ended.spent, ended.reserved, ended.calls) == (0.01, 0.0, 1)


def test_counting_tokens_costs_nothing_but_counts_against_the_rate() -> None:
    count = Call(True, "claude-sonnet-4-5", 0, 10_000_000)
    assert count.worst_case_usd() == 0.0
    account = replace(fresh(), spent=1.0)  # the day's budget spent: counting still works
    assert check(LIMITS, NOON, count, account) is None
    assert reserve(LIMITS, account, NOON, count).recent == (NOON,)


def test_the_report_says_the_cap_the_spend_and_when_it_starts_again() -> None:
    account = settle(reserve(LIMITS, fresh(), NOON, SONNET), NOON, SONNET, 0.25)
    shown = report(LIMITS, account, NOON)
    assert shown["daily_usd"] == 1.0 and shown["spent_today_usd"] == 0.25 and shown["calls_today"] == 1
    assert shown["resets_at"] == JAN_1_2030 + DAY and shown["in_flight_usd"] == 0.0
    assert shown["models"] == ["claude-haiku-4-5", "claude-sonnet-4-5"]


@pytest.mark.parametrize(("body", "says"), [
    (b"not json", "not a Messages API request"),
    (b'{"model": 7, "max_tokens": 5}', "not a Messages API request"),
    (b'{"max_tokens": 5}', "names no model"),
    (b'{"model": "m"}', "sets no max_tokens"),
    (b'{"model": "m", "max_tokens": 0}', "sets no max_tokens"),
    (b'{"model": "m", "max_tokens": 5, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not a Messages API request"),
])
def test_a_body_that_makes_no_call_says_why(body: bytes, says: str) -> None:
    found = read_call(body, counts_tokens=False)
    assert isinstance(found, Refusal) and says in found.message and found.reason == "invalid"
    assert found.message.startswith(REFUSED_BY) and found.status == 400 and not found.retry


def test_a_key_given_twice_is_refused_whatever_the_proxy_would_read() -> None:
    """JSON parsers differ on which of two equal keys wins: the budget read the last max_tokens, a
    proxy reading the first would bill 90,000."""
    for body in (b'{"model": "m", "max_tokens": 90000, "max_tokens": 5, "messages": []}',
                 b'{"model": "claude-opus-4-1", "model": "m", "max_tokens": 5, "messages": []}',
                 b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": '
                 b'[{"type": "image", "source": {"type": "url", "type": "base64"}}]}]}'):
        found = read_call(body, counts_tokens=False)
        assert isinstance(found, Refusal) and "twice in one object" in found.message, body


BASE = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def nested(block: dict[str, object]) -> dict[str, object]:
    """`block` inside a tool result, as a turn carries it."""
    return BASE | {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x"}, block]}]}]}


@pytest.mark.parametrize(("body", "betas", "says"), [
    (BASE | {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]},
     (), "input (document) by URL or file id"),
    (nested({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}), (), "input (image) by URL"),
    (nested({"type": "image", "source": {"type": "file", "file_id": "file_1"}}), (), "by URL or file id"),
    (BASE | {"system": [{"type": "container_upload", "file_id": "file_1"}]}, (), "by URL or file id"),
    (BASE | {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, (), "server tool 'web_fetch_20250910'"),
    (BASE | {"tools": [{"name": "mine", "input_schema": {}}, {"type": "web_search_20250305", "name": "s"}]}, (),
     "server tool 'web_search_20250305'"),
    (BASE | {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, (), "MCP servers"),
    (BASE | {"service_tier": "auto"}, (), "service_tier='auto'"),
    (BASE | {"speed": "fast"}, (), "speed='fast'"),
    (BASE | {"inference_geo": "us"}, (), "inference_geo='us'"),
    (BASE, (b"claude-code-20250219,context-1m-2025-08-07",), "the beta 'context-1m-2025-08-07'"),
    (BASE, (b"effort-2025-11-24", b"fast-mode-2026-02-01"), "the beta 'fast-mode-2026-02-01'"),
    (BASE, (b"extended-cache-ttl-2025-04-11",), "the beta 'extended-cache-ttl-2025-04-11'"),
])
def test_a_call_whose_cost_its_body_does_not_bound_is_refused_saying_why(
        body: dict[str, object], betas: tuple[bytes, ...], says: str) -> None:
    found = read_call(json.dumps(body).encode(), counts_tokens=False, betas=betas)
    assert isinstance(found, Refusal) and found.reason == "unbounded" and found.status == 400, found
    assert says in found.message and found.message.startswith(REFUSED_BY)


def test_what_the_cli_sends_is_bounded() -> None:
    """The betas and fields the bundled CLI sends (as the mock Bridge saw them), inline images and
    documents, the agent's own tools, and a search result's URL: all go."""
    cli_betas = (b"claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
                 b"per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,"
                 b"thinking-token-count-2026-05-13,effort-2025-11-24,thinking-display-updates-2026-08-18")
    body = BASE | {"thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "medium"},
                   "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                   "metadata": {"user_id": "u"}, "system": [{"type": "text", "text": "s"}], "service_tier": "standard_only",
                   "tools": [{"name": "Bash", "input_schema": {}}, {"type": "custom", "name": "x", "input_schema": {}}]}
    assert isinstance(read_call(json.dumps(body).encode(), counts_tokens=False, betas=(cli_betas,)), Call)
    for block in ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                  {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
                  {"type": "search_result", "source": "https://x", "title": "t", "content": [{"type": "text", "text": "x"}]}):
        assert isinstance(read_call(json.dumps(nested(block)).encode(), counts_tokens=False), Call), block


def test_a_call_is_read_from_its_body_and_the_rest_is_skipped() -> None:
    body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 900, "stream": True,
                       "messages": [{"role": "user", "content": "x" * 1000}]}).encode()
    assert read_call(body, counts_tokens=False) == Call(False, "claude-sonnet-4-5", 900, len(body))
    assert read_call(b'{"model": "m", "messages": []}', counts_tokens=True) == Call(True, "m", 0, 30)


def test_settings_name_the_agents_limits_and_refuse_bad_ones() -> None:
    s = load_settings({"SPRITE_AGENT_MODEL": "claude-sonnet-4-5", "SPRITE_AGENT_MODELS": "a, b,,a",
                       "SPRITE_AGENT_DAILY_BUDGET_USD": "$2.50", "SPRITE_AGENT_MAX_TOKENS": "4096",
                       "SPRITE_AGENT_REQUESTS_PER_MINUTE": "30"})
    limits = AgentLimits.of(s)
    assert limits.models == {"claude-sonnet-4-5", s.memory_model, "a", "b"}
    assert (limits.daily_usd, limits.max_tokens, limits.per_minute) == (2.5, 4096, 30)
    defaults = AgentLimits.of(load_settings({}))
    assert defaults.models == {"claude-opus-5-5", "claude-haiku-4-5"} and defaults.daily_usd == 10.0
    for name, bad in (("SPRITE_AGENT_DAILY_BUDGET_USD", "0"), ("SPRITE_AGENT_MAX_TOKENS", "-1"),
                      ("SPRITE_AGENT_REQUESTS_PER_MINUTE", "lots")):
        with pytest.raises(ConfigError, match=name):
            load_settings({name: bad})


# ---------------------------------------------------------------- the usage of a reply


def sse(*events: dict[str, object]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


START = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1200, "output_tokens": 1,
                                                                   "cache_read_input_tokens": 5000,
                                                                   "cache_creation_input_tokens": 300}}}
DELTA = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello " * 10}}
END = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 420}}


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_a_streamed_reply_is_priced_from_its_usage_however_it_is_chunked(size: int) -> None:
    raw = sse(START, DELTA, DELTA, END, {"type": "message_stop"})
    meter = UsageMeter(stream=True)
    for at in range(0, len(raw), size):
        meter.feed(raw[at:at + size])
    meter.finish()
    assert meter.complete and meter.usage() == {"input_tokens": 1200, "output_tokens": 420,
                                                "cache_read_input_tokens": 5000, "cache_creation_input_tokens": 300}
    assert meter.cost("claude-sonnet-4-5", 99.0) == pytest.approx(cost_usd("claude-sonnet-4-5", 1200, 420, 300, 5000))


def test_a_reply_cut_short_counts_its_bytes_as_output_and_one_with_no_usage_its_worst_case() -> None:
    cut = UsageMeter(stream=True)
    cut.feed(sse(START, *[DELTA] * 50))
    assert not cut.complete
    assert cut.cost("claude-sonnet-4-5", 99.0) == pytest.approx(
        cost_usd("claude-sonnet-4-5", 1200, -(-cut.bytes // 4), 300, 5000))
    nothing = UsageMeter(stream=True)
    nothing.feed(b"event: ping\ndata: {}\n\n")
    assert nothing.cost("claude-sonnet-4-5", 99.0) == 99.0


def test_a_huge_event_is_skipped_without_being_held_and_the_usage_after_it_is_read() -> None:
    meter = UsageMeter(stream=True)
    meter.feed(sse(START))
    big = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x" * (MAX_USAGE_EVENT * 4)}}
    raw = sse(big)
    for at in range(0, len(raw), 4096):
        meter.feed(raw[at:at + 4096])
        assert len(meter._buffer) <= MAX_USAGE_EVENT + 4096
    meter.feed(sse(END))
    assert meter.complete and meter.usage()["output_tokens"] == 420


def test_a_json_reply_is_priced_from_its_usage() -> None:
    meter = UsageMeter(stream=False)
    body = json.dumps({"id": "m", "content": [], "usage": {"input_tokens": 10, "output_tokens": 5}}).encode()
    meter.feed(body[:9])
    meter.feed(body[9:])
    meter.finish()
    assert meter.complete and meter.cost("claude-haiku-4-5", 1.0) == pytest.approx(cost_usd("claude-haiku-4-5", 10, 5))


# ---------------------------------------------------------------- the book


async def test_the_days_spending_survives_a_restart_and_memory_status_shows_it(tmp_path: Path) -> None:
    path = tmp_path / "agent_spend.json"
    now = [NOON]
    book = SpendBook(LIMITS, path, clock=lambda: now[0])
    await book.start()
    assert book.admit(SONNET) is None
    book.settle(SONNET, 0.4)
    assert book.admit(replace(SONNET, model="gpt-9")) is not None
    await book.stop()
    again = SpendBook(LIMITS, path, clock=lambda: now[0])
    await again.start()
    assert again.report()["spent_today_usd"] == 0.4 and again.report()["refused_today"] == {"model": 1}
    await again.stop()
    shown = status_report(path, NOON + 60)
    assert shown is not None and shown["spent_today_usd"] == 0.4 and shown["daily_usd"] == 1.0
    assert (status_report(path, JAN_1_2030 + DAY) or {})["spent_today_usd"] == 0.0  # a new day
    now[0] = JAN_1_2030 + DAY
    tomorrow = SpendBook(LIMITS, path, clock=lambda: now[0])
    await tomorrow.start()
    assert tomorrow.report()["spent_today_usd"] == 0.0
    await tomorrow.stop()
    record = read_record(path)
    assert record is not None and record.day == JAN_1_2030 + DAY


def test_a_kill_mid_write_leaves_no_temp_file_once_the_book_loads_again(tmp_path: Path) -> None:
    """The chaos suite's kills found `.agent_spend.json.*.tmp` left for good after a kill between
    the temp file and its rename; the book, the file's one writer, sweeps them when it loads."""
    path = tmp_path / "agent_spend.json"
    debris = tmp_path / ".agent_spend.json.ab12cd34.tmp"
    other = tmp_path / ".capture.json.ab12cd34.tmp"  # not the book's: stays
    debris.write_text("{")
    other.write_text("{")
    SpendBook(LIMITS, path, clock=lambda: NOON).load()
    assert not debris.exists() and other.exists()


async def test_a_file_that_cannot_be_read_starts_the_day_at_nought_and_a_full_disk_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent_spend.json"
    path.write_text("{not json")
    book = SpendBook(LIMITS, path, clock=lambda: NOON)
    await book.start()
    assert book.report()["spent_today_usd"] == 0.0
    from sprite_os.agent import spend_book

    failures = []

    def full(*_: object, **__: object) -> None:
        failures.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spend_book, "atomic_write", full)
    book.admit(SONNET)
    book.settle(SONNET, 0.3)
    while not failures:
        await asyncio.sleep(0.01)
    assert book.report()["spent_today_usd"] == 0.3  # still counted, in memory
    monkeypatch.undo()
    await book.stop()  # the last write goes through
    assert (status_report(path, NOON) or {})["spent_today_usd"] == 0.3


def test_a_retryable_refusal_is_remembered_for_the_clis_retry_notice(tmp_path: Path) -> None:
    now = [NOON]
    book = SpendBook(replace(LIMITS, per_minute=1), tmp_path / "s.json", clock=lambda: now[0])
    assert book.retry_reason() is None
    assert book.admit(SONNET) is None
    refusal = book.admit(SONNET)
    assert refusal is not None and refusal.reason == "rate"
    assert book.retry_reason() == refusal.message
    now[0] += 31
    assert book.retry_reason() is None


async def test_memory_status_shows_the_agents_spending_as_the_server_keeps_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from sprite_os.agent.spend_book import SPEND_FILE
    from sprite_os.commands.main import main
    from sprite_os.paths import Layout

    layout = Layout(tmp_path / "ws")
    layout.ensure()
    book = SpendBook(LIMITS, layout.state_dir / SPEND_FILE)
    await book.start()
    assert book.admit(SONNET) is None
    book.settle(SONNET, 0.4)
    book.admit(replace(SONNET, model="claude-opus-4-1"))
    await book.stop()
    assert await asyncio.to_thread(main, ["--workspace", str(layout.root), "memory", "status"]) == 0
    text = capsys.readouterr().out
    assert "  agent spending   $0.4000 of $1.00 today (UTC), 1 calls; refused: 1 model\n" in text, text
    assert await asyncio.to_thread(main, ["--workspace", str(layout.root), "memory", "status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["agent_budget"]
    assert shown["spent_today_usd"] == 0.4 and shown["daily_usd"] == 1.0 and shown["resets_at"] > time.time()
    (layout.state_dir / SPEND_FILE).unlink()
    assert await asyncio.to_thread(main, ["--workspace", str(layout.root), "memory", "status"]) == 0
    assert "  agent spending   unknown (the server has not started since it records it)" in capsys.readouterr().out
