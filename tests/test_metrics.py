"""/metrics' figures from a /healthz body and the published frames, without a server."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sprite_os import protocol as p
from sprite_os.metrics import Metrics


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def body(**agent: Any) -> dict[str, Any]:
    return {"status": "failed" if agent.get("failure") else "ok", "uptime_s": 12.5, "clients": 1,
            "agent": {"state": "idle", "queued_messages": 0, "failure": None, **agent}}


def test_a_failing_agent_and_what_happened_are_both_in_the_scrape() -> None:
    m = Metrics()
    m.observe(p.TurnComplete(turn_id="t", status="error", duration_ms=2500, usage=p.Usage()))
    m.observe(p.Error(code="agent_failed", message="The agent cannot start", turn_id="t"))
    m.observe(p.ModelRetry(turn_id="t", attempt=1, max_retries=10, retry_delay_ms=500))
    got = samples(m.render(body(failure={"reason": "Read-only file system", "failed_starts": 3})))
    assert got[("sprite_up", ())] == 0 and got[("sprite_agent_failed", ())] == 1
    assert got[("sprite_agent_failed_starts", ())] == 3
    assert got[("sprite_turns_total", (("status", "error"),))] == 1
    assert got[("sprite_turn_duration_seconds_bucket", (("le", "2.5"),))] == 1
    assert got[("sprite_error_frames_total", (("code", "agent_failed"),))] == 1
    assert got[("sprite_model_retries_total", ())] == 1
    assert not any(name.startswith("sprite_capture") for name, _ in got)  # a server without memory
    assert samples(m.render(body()))[("sprite_up", ())] == 1  # the state is read at each scrape, not kept


def test_turns_that_could_not_be_saved_are_counted_apart() -> None:
    m = Metrics()
    m.observe(p.TurnComplete(turn_id="a", status="completed", duration_ms=100, usage=p.Usage()))
    m.observe(p.TurnComplete(turn_id="b", status="completed", duration_ms=100, usage=p.Usage(), saved=False))
    got = samples(m.render(body()))
    assert got[("sprite_turns_total", (("status", "completed"),))] == 2
    assert got[("sprite_turns_not_saved_total", ())] == 1


def test_a_set_aside_or_stuck_turn_journal_is_a_gauge_of_its_own() -> None:
    """`sprite_memory_degraded 1` could not say a turn journal was why: no metric reported one."""
    capture = {"queued": 0, "spilled": 0, "consecutive_failures": 0, "journal_stuck": True,
               "journals_set_aside": ["turn-journal.json.damaged-20261127T090000"]}
    memory = {"degraded": True, "capture": capture, "observations": {}, "consecutive_failures": 0}
    got = samples(Metrics().render({**body(), "memory": memory}))
    assert got[("sprite_memory_degraded", ())] == 1
    assert got[("sprite_capture_journals_set_aside", ())] == 1 and got[("sprite_capture_journal_stuck", ())] == 1


def test_the_agents_spending_its_cap_and_its_refusals_are_gauges() -> None:
    from sprite_os.agent.budget import AgentLimits, Call, SpendDay, refused, report, settle
    from sprite_os.spending import day_start

    limits = AgentLimits(models=frozenset({"claude-sonnet-4-5"}), daily_usd=2.0, max_tokens=8192, per_minute=30)
    now = 1_750_000_000.0
    call = Call(counts_tokens=False, model="claude-sonnet-4-5", max_tokens=1024, body_bytes=2000)
    account = refused(settle(SpendDay(day_start(now)), now, call, 1.25), now, "budget")
    got = samples(Metrics().render(body(budget=report(limits, account, now))))
    assert got[("sprite_agent_daily_budget_usd", ())] == 2.0 and got[("sprite_agent_spent_today_usd", ())] == 1.25
    assert got[("sprite_agent_refused_calls_today", (("reason", "budget"),))] == 1
    assert ("sprite_agent_spent_today_usd", ()) not in samples(Metrics().render(body()))  # no budget, no gauge


def test_a_forget_kept_for_later_or_cut_short_is_in_the_scrape() -> None:
    """memory.forget's figures: the jobs waiting, how long the pass has kept one (0 while none is kept, as
    /healthz's null), and the forgets an error cut short."""
    memory = {"degraded": True, "capture": {"queued": 0, "spilled": 0, "consecutive_failures": 0},
              "observations": {}, "consecutive_failures": 0,
              "forget": {"jobs_waiting": 2, "kept_for_s": 75.5, "cut_short_jobs": 1}}
    got = samples(Metrics().render({**body(), "memory": memory}))
    assert got[("sprite_forget_jobs_waiting", ())] == 2 and got[("sprite_forget_kept_seconds", ())] == 75.5
    assert got[("sprite_forget_cut_short", ())] == 1 and got[("sprite_memory_degraded", ())] == 1
    memory["forget"] = {"jobs_waiting": 0, "kept_for_s": None, "cut_short_jobs": 0}
    assert samples(Metrics().render({**body(), "memory": memory}))[("sprite_forget_kept_seconds", ())] == 0
