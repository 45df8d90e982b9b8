"""The curator's daily budget: the pure policy, the price table, the size of a call, and the daemon
with a budget, against the mock Bridge: the budget caps spending and loses nothing."""

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devkit.mock_bridge import MockBridge
from sprite_os import spending as pricing
from sprite_os.config import DEFAULT_BATCH_TOKENS, DEFAULT_MEMORY_MODEL
from sprite_os.dates import DAY
from sprite_os.errors import BudgetSpent
from sprite_os.memory.curation import daemon as daemon_module
from sprite_os.memory.curation.budget import BudgetRecord
from sprite_os.memory.curation.curator import (
    BATCH_CHARS,
    FIXED_MAX_CHARS,
    MIN_BATCH_TOKENS,
    PROMPT_ACTIONS,
    SYSTEM,
    build_prompt,
    fixed_chars,
    render_observation,
    split_batch,
    turn_chars,
)
from sprite_os.memory.curation.daemon import MemoryDaemon
from sprite_os.memory.files import MAX_FILE_BYTES, SPECS
from sprite_os.memory.memory_store import PendingAction
from sprite_os.memory.processor import MAX_REPLY_TOKENS, Completion, CuratorClient, input_tokens
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, Observation
from sprite_os.spending import MOST_EXPENSIVE, DailyBudget, cost_usd, day_start
from sprite_os.text import estimate_tokens
from tests.conftest import make_settings, wait_for
from tests.test_processor import Kit
from tests.test_processor import kit as kit

JAN_1_2030 = 1_893_456_000.0  # 2030-01-01 00:00:00 UTC
HOUR = 3600.0

# ---------------------------------------------------------------- the policy


def test_utc_days_begin_at_midnight_utc() -> None:
    assert time.gmtime(JAN_1_2030)[:6] == (2030, 1, 1, 0, 0, 0)
    assert day_start(JAN_1_2030) == JAN_1_2030  # midnight belongs to the day it begins
    assert day_start(JAN_1_2030 + DAY - 0.001) == JAN_1_2030
    assert day_start(JAN_1_2030 - 0.001) == JAN_1_2030 - DAY


@pytest.mark.parametrize(("spent", "estimate", "allowed"), [
    (0.0, 0.04, True),
    (0.96, 0.04, True),  # exactly at the budget once the call is paid: allowed
    (0.97, 0.04, False),  # the call could take the day over it
    (1.0, 0.0, True),  # at the budget, a call that costs nothing could go...
    (1.0, 0.001, False),  # ...but no call costs nothing: the budget is spent
    (1.7, 0.04, False),  # over it (a call's usage beat its estimate): spent
])
def test_a_call_goes_out_only_if_the_day_can_pay_its_worst_case(spent: float, estimate: float,
                                                                 allowed: bool) -> None:
    now = JAN_1_2030 + 13 * HOUR
    decision = DailyBudget(1.0).check(now, spent, estimate)
    assert (decision.allowed, decision.spent, decision.estimate) == (allowed, spent, estimate)
    assert decision.resumes_at == (None if allowed else JAN_1_2030 + DAY)  # the next UTC midnight


def test_the_next_utc_day_starts_afresh() -> None:
    budget = DailyBudget(1.0)
    late = budget.check(JAN_1_2030 + DAY - 1, spent=0.99, estimate=0.04)
    assert late.resumes_at == JAN_1_2030 + DAY
    # The caller sums the new day's calls from its start: yesterday's spending is not today's.
    assert budget.check(JAN_1_2030 + DAY, spent=0.0, estimate=0.04).allowed


def test_the_report_shows_spending_the_budget_and_a_wait_until_it_is_over() -> None:
    budget = DailyBudget(0.5)
    now = JAN_1_2030 + 20 * HOUR
    assert budget.report(now, 0.1234567, None) == {
        "daily_usd": 0.5, "spent_today_usd": 0.123457, "waiting": False, "resumes_at": None}
    assert budget.report(now, 0.49, JAN_1_2030 + DAY) == {
        "daily_usd": 0.5, "spent_today_usd": 0.49, "waiting": True, "resumes_at": JAN_1_2030 + DAY}
    # A wait whose day has come (the daemon has not acted on it yet, or is stopped) is over.
    assert budget.report(JAN_1_2030 + DAY, 0.0, JAN_1_2030 + DAY)["waiting"] is False


def test_the_budget_record_round_trips_and_an_unreadable_one_is_ignored() -> None:
    record = BudgetRecord(2.5, JAN_1_2030)
    assert BudgetRecord.loads(record.dumps()) == record
    assert BudgetRecord.loads(BudgetRecord(1.0).dumps()) == BudgetRecord(1.0, None)
    assert BudgetRecord.loads(None) is None and BudgetRecord.loads("") is None
    assert BudgetRecord.loads("{not json") is None and BudgetRecord.loads('{"resumes_at": 1}') is None


# ---------------------------------------------------------------- prices


@pytest.mark.parametrize(("model", "price"), [
    ("claude-haiku-4-5", (1.0, 5.0)),
    ("claude-haiku-4-5-20251001", (1.0, 5.0)),
    ("claude-3-5-haiku-20241022", (0.8, 4.0)),
    ("claude-sonnet-4-5", (3.0, 15.0)),
    ("claude-opus-4-5-20251101", (5.0, 25.0)),  # the longest matching prefix wins
    ("claude-opus-4-1", (15.0, 75.0)),
])
def test_prices_by_model_prefix(model: str, price: tuple[float, float]) -> None:
    assert pricing.prices(model) == price


def test_an_unknown_model_is_priced_as_the_most_expensive_known_one_and_logged_once() -> None:
    assert MOST_EXPENSIVE == (15.0, 75.0)
    with capture_logs() as logs:
        assert pricing.prices("some-proxy-alias") == MOST_EXPENSIVE
        assert cost_usd("some-proxy-alias", 1_000_000, 1_000_000) == 90.0
    assert [x["event"] for x in logs] == ["model_unpriced"]
    assert logs[0]["model"] == "some-proxy-alias" and logs[0]["log_level"] == "warning"


def test_cost_is_priced_from_tokens() -> None:
    assert cost_usd("claude-haiku-4-5", 20_000, 2_000) == pytest.approx(0.02 + 0.01)
    # The worst case of a call of the default cap: its whole input, and a reply at the cap.
    assert cost_usd(DEFAULT_MEMORY_MODEL, DEFAULT_BATCH_TOKENS, MAX_REPLY_TOKENS) == pytest.approx(0.10096)


# ---------------------------------------------------------------- the size of a call


def _turn(n: int, chars: int) -> Observation:
    return Observation(id=n, timestamp=JAN_1_2030, session_id="s" * 36, sequence_num=n, user_message="u" * 1_000,
                       tool_calls_json="[]", agent_response="a" * chars)


def _largest_context() -> tuple[dict[str, str], list[PendingAction]]:
    files = {name: ("- " + "x" * 197 + "\n") * spec.max_lines for name, spec in SPECS.items()}
    files = {name: text.encode()[:MAX_FILE_BYTES].decode() for name, text in files.items()}
    actions = [PendingAction(10**6 + n, 0.0, "c" * 600, 0, "pending", None) for n in range(PROMPT_ACTIONS)]
    return files, actions


def test_a_full_25_turn_batch_with_every_file_at_its_cap_fits_the_default_cap() -> None:
    files, actions = _largest_context()
    turns = [_turn(n, 1_355) for n in range(1, 26)]
    turn_text = sum(len(render_observation(o)) for o in turns)
    assert BATCH_CHARS - 200 < turn_text <= BATCH_CHARS  # 25 turns at the character limit
    assert split_batch(turns, turn_chars(DEFAULT_BATCH_TOKENS, fixed_chars(files, actions))) == [turns]
    tokens = estimate_tokens(len(SYSTEM) + len(build_prompt(files, turns, actions)))
    assert 55_000 < tokens <= DEFAULT_BATCH_TOKENS  # measured: ~55,900 of 60,000
    assert fixed_chars(files, actions) <= FIXED_MAX_CHARS  # the reserve is the largest fixed part


def test_the_smallest_cap_holds_one_turn_of_the_largest_size_beside_the_largest_files() -> None:
    files, actions = _largest_context()
    huge = Observation(id=1, timestamp=JAN_1_2030, session_id="s", sequence_num=1, user_message="u" * 50_000,
                       tool_calls_json=json.dumps([{"name": "Bash", "input": "i" * 900, "output": "o" * 900}] * 30),
                       agent_response="a" * 50_000)
    prompt = build_prompt(files, [huge], actions)
    assert estimate_tokens(len(SYSTEM) + len(prompt)) <= MIN_BATCH_TOKENS
    assert turn_chars(MIN_BATCH_TOKENS, fixed_chars(files, actions)) >= len(render_observation(huge))


def test_a_lower_cap_splits_a_batch_by_what_the_files_leave() -> None:
    turns = [_turn(n, 1_355) for n in range(1, 26)]  # ~2,400 characters each
    small = fixed_chars({}, [])
    cap = estimate_tokens(small + 10_000)
    chunks = split_batch(turns, turn_chars(cap, small))
    assert [len(c) for c in chunks] == [4] * 6 + [1]
    assert [o for c in chunks for o in c] == turns  # in order, nothing lost or repeated
    files, actions = _largest_context()  # the same cap beside full files: a turn a call
    assert [len(c) for c in split_batch(turns, turn_chars(cap, fixed_chars(files, actions)))] == [1] * 25


# ---------------------------------------------------------------- the processor asks before each call


async def test_the_gate_is_asked_with_each_calls_estimated_input_and_a_refusal_records_nothing(kit: Kit) -> None:
    asked: list[int] = []

    async def refuse(tokens: int) -> None:
        asked.append(tokens)
        raise BudgetSpent("spent", JAN_1_2030)

    obs = await kit.turns("hello")
    with pytest.raises(BudgetSpent):
        await kit.processor.process(obs, "batch", gate=refuse)
    assert kit.bridge.curator_requests() == [] and await kit.memory.call(lambda m: m.recent_batches(5)) == []
    assert await kit.transcript.call(lambda t: t.counts()["pending"]) == 1

    async def allow(tokens: int) -> None:
        asked.append(tokens)

    await kit.processor.process(obs, "batch", gate=allow)
    [request] = kit.bridge.curator_requests()
    assert asked == [estimate_tokens(len(SYSTEM) + len(request.last_user_text))] * 2


async def test_a_refused_second_call_leaves_the_batch_with_its_first_reply(kit: Kit) -> None:
    obs = await kit.turns("installed ffmpeg")
    kit.bridge.curator.script("TOOL_INSTALL: ffmpeg\nTOOLS_MD_UPDATE:\n" + "- line\n" * 400)  # over its limit
    calls: list[int] = []

    async def once(tokens: int) -> None:
        calls.append(tokens)
        if len(calls) > 1:
            raise BudgetSpent("spent", JAN_1_2030)

    result = await kit.processor.process(obs, "batch", gate=once)
    assert len(kit.bridge.curator_requests()) == 1 and len(calls) == 2 and calls[1] > calls[0]
    assert result.learnings_added == 1 and result.files_kept == ["tools.md"]
    assert await kit.transcript.call(lambda t: t.counts()["processed"]) == 1


# ---------------------------------------------------------------- the daemon with a budget


class FullReplies(CuratorClient):
    """Bills every call at the worst case the budget reckons with (its estimated input and a reply
    at the cap), where the mock Bridge reports a few tokens: a day's calls then add up."""

    async def complete(self, messages: list[dict[str, Any]]) -> Completion:
        done = await super().complete(messages)
        return replace(done, input_tokens=input_tokens(messages), output_tokens=MAX_REPLY_TOKENS)


class WallClock:
    """time.time, moved to a chosen moment, running at the real pace, and moved on at will."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, start: float) -> None:
        self._real: Callable[[], float] = time.time
        self.offset = start - self._real()
        monkeypatch.setattr(time, "time", self)

    def __call__(self) -> float:
        return self._real() + self.offset

    def advance_to(self, moment: float) -> None:
        self.offset = moment - self._real()


async def _counts(kit: Kit) -> dict[str, int]:
    return await kit.transcript.call(lambda t: t.counts())


async def _memory_status(workspace: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    from sprite_os.commands.main import main

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--workspace", str(workspace), "memory", "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert await asyncio.to_thread(main, ["--workspace", str(workspace), "memory", "status"]) == 0
    return report, capsys.readouterr().out


async def test_the_budget_caps_spending_and_loses_nothing(
        kit: Kit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock = WallClock(monkeypatch, JAN_1_2030 + HOUR)
    monkeypatch.setattr(daemon_module, "BUDGET_RECHECK", 0.05)
    monkeypatch.setattr(daemon_module, "MAX_CHUNK_TURNS", 3)  # three turns a call, whatever the token cap allows
    kit.processor.curator = FullReplies(make_settings(tmp_path, kit.bridge.url))
    a_call = cost_usd(DEFAULT_MEMORY_MODEL, 1_000, MAX_REPLY_TOKENS)  # about what each call costs here
    d = MemoryDaemon(kit.processor, batch_turns=3, budget=DailyBudget(2.5 * a_call))  # two calls a day
    gate = d._may_call
    asked = [0]

    async def counted(tokens: int) -> None:
        asked[0] += 1
        await gate(tokens)

    monkeypatch.setattr(d, "_may_call", counted)
    await d.start()
    try:
        assert await d.settle(60)
        await kit.turns(*[f"turn {n}" for n in range(1, 10)])  # three batches
        d.trigger("test")
        await wait_for(lambda: d.resumes_at is not None, what="a budget wait")
        assert len(kit.bridge.curator_requests()) == 2  # the third batch waits...
        assert await _counts(kit) == {"pending": 3, "processed": 6, "stale": 0, "total": 9}
        assert d.resumes_at == JAN_1_2030 + DAY  # ...for the next UTC day
        spent = await kit.memory.call(lambda m: m.cost_since(JAN_1_2030))
        assert 2 * 0.8 * a_call < spent <= d.budget.daily_usd  # two calls, paid in full, within the budget
        report, text = await _memory_status(tmp_path, capsys)
        assert report["budget"] == {"daily_usd": d.budget.daily_usd, "spent_today_usd": round(spent, 6),
                                    "waiting": True, "resumes_at": JAN_1_2030 + DAY}
        assert f"of ${d.budget.daily_usd:.2f} spent today (UTC); spent: batches wait until 2030-01-02 00:00 UTC" in text
        system = MemorySystem(make_settings(tmp_path, kit.bridge.url))  # what /healthz shows: the same
        system.daemon = d

        async def counted() -> bool:  # the day's spending is counted with the turns: 0.5 s at most, else the last
            return (await system.health())["budget"] == report["budget"]

        try:
            await wait_for(counted, what="the day's spending counted as memory status counts it")
        finally:
            await asyncio.gather(system.transcript.close(), system.memory.close(), system.curator.close())

        # Seven hours on, the same day: the wait is no failure, so nothing is marked stale.
        clock.advance_to(JAN_1_2030 + 8 * HOUR)
        seen = asked[0]
        await wait_for(lambda: asked[0] >= seen + 3, what="rechecks of the budget")
        assert await _counts(kit) == {"pending": 3, "processed": 6, "stale": 0, "total": 9}
        assert d.clock.since is None and d.clock.failures == 0 and d.status()["degraded"] is False
        assert d.health.last_error is None and len(kit.bridge.curator_requests()) == 2
        batches = await kit.memory.call(lambda m: m.recent_batches(100))
        assert [b.status for b in batches] == ["done", "done"]  # no failed call recorded

        # The next UTC day: the waiting turns are curated, exactly once.
        clock.advance_to(JAN_1_2030 + DAY + 60)
        await wait_for(lambda: _pending_is(kit, 0), what="the waiting turns curated")
        assert await d.settle(60)
        assert d.resumes_at is None and len(kit.bridge.curator_requests()) == 3
        batches = await kit.memory.call(lambda m: m.recent_batches(100))
        covered = sorted(i for b in batches if b.status == "done" for i in b.observation_ids)
        assert covered == list(range(1, 10)) and len(batches) == 3
        assert await kit.memory.call(lambda m: m.cost_since(JAN_1_2030 + DAY)) <= d.budget.daily_usd
        report, text = await _memory_status(tmp_path, capsys)
        assert report["budget"]["waiting"] is False and report["budget"]["resumes_at"] is None
        assert "spent today (UTC)\n" in text and "batches wait" not in text
    finally:
        await d.stop(flush_budget=0)
        await kit.processor.curator.close()


async def test_a_flush_or_a_settle_during_a_budget_wait_returns_at_once(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_module, "BUDGET_RECHECK", 5.0)  # the next look comes within their budgets
    d = MemoryDaemon(kit.processor, batch_turns=25, budget=DailyBudget(0.01))  # less than one call
    await d.start()
    try:
        await kit.turns("hello")
        d.trigger("test")
        await wait_for(lambda: d.resumes_at is not None, what="a budget wait")
        started = time.monotonic()
        assert await d.flush("precompact", budget=60) is False
        assert await d.settle(60) is False
        assert time.monotonic() - started < 60  # at once: neither waited out its budget for a look
        assert kit.bridge.curator_requests() == [] and await _pending_is(kit, 1)
    finally:
        await d.stop(flush_budget=10)
    assert await _pending_is(kit, 1)  # the shutdown's flush did not send it either: it waits


async def _pending_is(kit: Kit, n: int) -> bool:
    return (await _counts(kit))["pending"] == n


async def test_healthz_and_memory_status_say_when_the_budget_is_spent(
        tmp_path: Path, bridge: MockBridge, capsys: pytest.CaptureFixture[str]) -> None:
    from sprite_os.memory.system import MemorySystem

    # Less than one call's worst case: nothing goes out, and the operator is told at start.
    settings = make_settings(tmp_path, bridge.url, memory_daily_budget_usd=0.01)
    system = MemorySystem(settings)
    with capture_logs() as logs:
        await system.start()
    try:
        await system.transcript.call(lambda t: t.append(NewObservation(
            timestamp=time.time(), session_id="s1", sequence_num=1, user_message="hello",
            tool_calls_json="[]", agent_response="ok")))
        system.daemon.trigger("test")
        await wait_for(lambda: system.daemon.resumes_at is not None, what="a budget wait")

        async def counted() -> bool:  # /healthz counts at most once a second, and waits 0.5 s at most for it
            return (await system.health())["observations"].get("pending") == 1

        await wait_for(counted, what="the turn counted")
        health = await system.health()
    finally:
        await system.stop()
    assert "memory_budget_below_one_call" in [x["event"] for x in logs]
    budget = health["budget"]
    resumes_at = budget["resumes_at"]
    assert resumes_at % DAY == 0 and 0 < resumes_at - time.time() <= DAY  # the next UTC midnight
    assert budget == {"daily_usd": 0.01, "spent_today_usd": 0.0, "waiting": True, "resumes_at": resumes_at}
    assert bridge.curator_requests() == []
    assert health["observations"]["pending"] == 1 and health["consecutive_failures"] == 0  # the rest stays
    assert health["degraded"] is False and health["last_error"] is None  # no failure
    # `memory status` shows the server's budget (its environment may differ from the shell's).
    report, text = await _memory_status(tmp_path, capsys)
    assert report["budget"] == budget
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(resumes_at))
    assert f"  budget           $0.0000 of $0.01 spent today (UTC); spent: batches wait until {when}\n" in text
