"""The daemon: batches on triggers, backs off while the proxy is down, loses and repeats nothing."""

import asyncio
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devkit.harness import wait_for
from devkit.mock_bridge import Fault, RecordedRequest
from sprite_os.backoff import Backoff
from sprite_os.memory.curation import daemon as daemon_module
from sprite_os.memory.curation.curator import SYSTEM, fixed_chars
from sprite_os.memory.curation.daemon import MemoryDaemon
from sprite_os.memory.curation.retry import (
    FAILING_KEY,
    STALE_MIN_FAILURES,
    UNUSABLE_LIMIT,
    Probe,
    Verdict,
)
from sprite_os.memory.forget.jobs import FORGET_PASS
from sprite_os.memory.schema import STALE
from sprite_os.text import estimate_tokens
from tests.test_processor import Kit
from tests.test_processor import kit as kit


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_module, "BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(daemon_module, "BACKOFF_MAX", 0.2)
    monkeypatch.setattr(daemon_module, "CONFLICT_RETRY", 0.05)  # a person's edit during a call: 2 s


@pytest.fixture
async def daemon(kit: Kit) -> AsyncIterator[MemoryDaemon]:
    d = MemoryDaemon(kit.processor, batch_turns=3)
    await d.start()
    yield d
    await d.stop(flush_budget=0)


async def test_a_batch_runs_every_n_turns_and_not_before(kit: Kit, daemon: MemoryDaemon) -> None:
    assert await daemon.settle(60)  # the start trigger is done before these turns exist
    await kit.turns("one", "two")
    daemon.note_turn()
    daemon.note_turn()
    assert daemon._idle.is_set() and not daemon._wake.is_set()  # two turns asked for nothing...
    assert await daemon.settle(60) is True
    assert daemon.status()["batches_run"] == 0 and kit.bridge.curator_requests() == []  # ...and nothing ran
    assert await _pending(kit, 2)
    await kit.turns("three")
    daemon.note_turn()
    assert not daemon._idle.is_set()  # the third asked for a batch at once
    assert await daemon.settle(60) is True
    assert await _pending(kit, 0) and daemon.status()["batches_run"] == 1
    [request] = kit.bridge.curator_requests()
    assert "[#1]" in request.last_user_text and "[#3]" in request.last_user_text
    [batch] = await kit.memory.call(lambda m: m.recent_batches(5))
    assert (batch.trigger, batch.status, batch.observation_ids) == ("batch", "done", [1, 2, 3])


async def test_proxy_down_then_up_processes_every_turn_exactly_once(kit: Kit, daemon: MemoryDaemon) -> None:
    kit.bridge.faults.add(Fault("status", status=529, target="curator", times=4))
    for n in range(7):
        await kit.turns(f"turn {n}")
        daemon.note_turn()
    kit.bridge.curator.default = "FACT: something from a batch"
    await wait_for(lambda: _pending(kit, 0), timeout=20)
    assert await daemon.settle(60)  # the last batch's status and the health land after its turns are marked
    batches = await kit.memory.call(lambda m: m.recent_batches(100))
    covered = [i for b in batches if b.status == "done" for i in b.observation_ids]
    assert sorted(covered) == list(range(1, 8))  # each turn in exactly one successful batch
    assert sum(b.status == "failed" for b in batches) == 4
    assert daemon.clock.failures == 0 and daemon.health.last_error is not None


async def test_six_hours_of_failure_marks_old_turns_stale(kit: Kit, daemon: MemoryDaemon) -> None:
    daemon.clock.stale_after = 0.3  # six hours, compressed
    kit.bridge.faults.add(Fault("status", status=500, target="curator"))
    await kit.turns("old turn")  # timestamps in the test kit are long past
    daemon.trigger("test")
    await wait_for(lambda: _count(kit, "stale", 1), timeout=10)
    assert daemon.status()["degraded"] is True
    kit.bridge.faults.clear()


async def test_flush_waits_within_its_budget(kit: Kit, daemon: MemoryDaemon) -> None:
    await kit.turns("a", "b")
    assert await daemon.flush("precompact", budget=10) is True
    assert await _pending(kit, 0)
    await kit.turns("c")
    kit.bridge.faults.add(Fault("latency", seconds=30.0, target="curator", times=1))
    started = time.monotonic()
    assert await daemon.flush("precompact", budget=0.3) is False
    assert time.monotonic() - started < 20  # bounded by the budget, not the 30 s call; the batch goes on


async def test_start_recovers_and_processes_what_a_crash_left(tmp_path: Path, kit: Kit) -> None:
    await kit.turns("left over from before the crash")
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()  # the start trigger alone must pick it up
    try:
        await wait_for(lambda: _pending(kit, 0))
        assert await d.settle(60) is True  # the batch's last writes land after its turns are marked
        assert json.loads(json.dumps(d.status()))["batches_run"] == 1
        [batch] = await kit.memory.call(lambda m: m.recent_batches(5))
        assert (batch.trigger, batch.status, batch.observation_ids) == ("start", "done", [1])
    finally:
        await d.stop(flush_budget=0)
    assert d.status()["batches_run"] == 1


async def _pending(kit: Kit, n: int) -> bool:
    return await _count(kit, "pending", n)


async def _count(kit: Kit, state: str, n: int) -> bool:
    return (await kit.transcript.call(lambda t: t.counts()))[state] == n


async def test_a_settle_that_races_the_end_of_a_run_is_answered(kit: Kit) -> None:
    await kit.processor.process(await kit.turns("already curated"), "batch")
    d = MemoryDaemon(kit.processor, batch_turns=25)  # not started: the end of a run is played by hand
    d._idle.clear()  # a run is under way...
    settling = asyncio.create_task(d.settle(60))
    await asyncio.sleep(0)  # ...settle looks up its target off the loop...
    d._idle.set()  # ...and the run ends meanwhile, resolving the waiters it knew of: none
    assert await settling is True  # everything is curated: not a timeout


async def test_a_flush_asked_during_a_run_is_answered_only_by_a_pass_begun_after_it(kit: Kit) -> None:
    """The stop's flush must see a forget's last pass (`before_batches`): a run already under way when
    the flush is asked ran its pass before the forget's lines were decided, so its end answers no flush."""
    gates = [asyncio.Event(), asyncio.Event()]
    passes = 0

    async def forget_pass() -> None:
        nonlocal passes
        passes += 1
        if passes <= len(gates):
            await gates[passes - 1].wait()

    d = MemoryDaemon(kit.processor, batch_turns=25)
    d.before_batches = forget_pass
    await d.start()  # its "start" run begins with the first pass, held open
    try:
        await wait_for(lambda: passes == 1, timeout=10, interval=0.005)
        flushing = asyncio.create_task(d.flush("shutdown", 30))
        await wait_for(lambda: bool(d._waiters), timeout=10, interval=0.005)
        gates[0].set()  # the run under way ends...
        await wait_for(lambda: passes == 2, timeout=10, interval=0.005)  # ...and the flush's own begins
        await asyncio.sleep(0.05)
        assert not flushing.done()  # answered by the run begun before it, it would skip the last pass
        gates[1].set()
        assert await flushing is True
    finally:
        for gate in gates:
            gate.set()
        await d.stop(flush_budget=0)


async def test_the_reasons_for_a_run_stay_few_however_many_turns_wait_for_it(kit: Kit) -> None:
    """While a backoff holds the run (the proxy down for hours), every turn asks for a batch again:
    what is kept until the run starts is the kinds of reason, not one entry a turn."""
    d = MemoryDaemon(kit.processor, batch_turns=3)  # not started: the run never comes
    for _ in range(10_000):
        d.note_turn()
    d.trigger("session-end")
    assert sorted(d._reasons) == ["batch", "session-end"]


async def test_settle_waits_for_requested_work_without_asking_for_more(kit: Kit, daemon: MemoryDaemon) -> None:
    assert await daemon.settle(60) is True  # nothing requested: at once
    await kit.turns("end of a session")
    kit.bridge.faults.add(Fault("latency", seconds=0.5, target="curator", times=1))
    daemon.trigger("session-end")
    assert await daemon.settle(0.1) is False  # the batch is still running
    assert await daemon.settle(60) is True
    assert await _pending(kit, 0)
    calls = len(kit.bridge.curator_requests())
    assert await daemon.settle(60) is True and len(kit.bridge.curator_requests()) == calls


async def test_persistent_editing_stops_costing_calls_after_three(kit: Kit, daemon: MemoryDaemon) -> None:
    kit.files.write("user.md", "# User\n", source="seed")
    await kit.turns("call me Ada")
    edits = iter(range(1000))

    def edit_during_call(request: object) -> str:  # a person (or a sync tool) edits during every call
        kit.files.path("user.md").write_text(f"# User\n- edit {next(edits)}\n")
        return "FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n"

    kit.bridge.curator.script(edit_during_call, edit_during_call, edit_during_call)
    daemon.trigger("test")
    await wait_for(lambda: _pending(kit, 0), timeout=20)
    assert await daemon.settle(60)
    assert len(kit.bridge.curator_requests()) == 3  # two discarded, the third commits without the file
    assert "- edit 2" in kit.files.read("user.md")  # the person's latest edit stands
    assert await kit.memory.call(lambda m: m.totals()["learnings"]) == 1
    batches = await kit.memory.call(lambda m: m.recent_batches(10))
    assert sum(b.status == "failed" and "edited during the call" in (b.error or "") for b in batches) == 2


async def test_flush_waits_for_the_turns_that_exist_not_for_a_backlog(kit: Kit, daemon: MemoryDaemon) -> None:
    await kit.turns(*[f"turn {n}" for n in range(9)])  # three batches of work
    kit.bridge.faults.add(Fault("latency", seconds=0.4, target="curator"))
    assert await daemon.flush("precompact", budget=10) is True
    assert await _pending(kit, 0)


async def test_a_batch_left_half_finished_by_an_error_is_finished_before_new_work(kit: Kit,
                                                                                   daemon: MemoryDaemon) -> None:
    obs = await kit.turns("hello")
    ids = [o.id for o in obs]
    await kit.memory.call(lambda m: m.commit_batch(
        trigger="batch", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[], file_updates={}, base_hashes={}))  # committed, then the marks failed
    daemon.trigger("test")
    await wait_for(lambda: _pending(kit, 0))
    assert kit.bridge.curator_requests() == []  # finished, not curated a second time


async def test_stale_needs_six_hours_and_five_failed_calls_and_survives_a_restart(kit: Kit) -> None:
    kit.bridge.faults.add(Fault("status", status=500, target="curator"))
    await kit.turns("old turn")  # timestamps in the test kit are long past
    # A spell that began seven hours ago but counted one failed call (its last just now, so no
    # sleep since): seven hours alone are not six hours of failure.
    spell = json.dumps({"since": time.time() - 7 * 3600, "failures": 1, "last": time.time()})
    await kit.memory.call(lambda m: m.set_meta(FAILING_KEY, spell))
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()
    try:
        await wait_for(lambda: _saved_failures(kit, 3))
        assert await _count(kit, "stale", 0)
        assert (await _saved_failing(kit))["since"] < time.time() - 6 * 3600  # kept, not reset
    finally:
        await d.stop(flush_budget=0)
    # A restart keeps the count and the clock: the fifth failed call marks the old turn stale.
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()
    try:
        await wait_for(lambda: _count(kit, "stale", 1))
        assert d.clock.failures >= STALE_MIN_FAILURES
        kit.bridge.faults.clear()
        await kit.turns("the proxy is back")
        d.trigger("test")
        await wait_for(lambda: _pending(kit, 0))
        await wait_for(lambda: _failing_cleared(kit))  # written after the turns are marked
        assert d.clock.since is None and d.clock.failures == 0
    finally:
        await d.stop(flush_budget=0)


async def _failing_cleared(kit: Kit) -> bool:
    return await kit.memory.call(lambda m: m.get_meta(FAILING_KEY)) == ""


async def _failures(d: MemoryDaemon, n: int) -> bool:
    return d.clock.failures >= n


async def _saved_failing(kit: Kit) -> dict[str, Any]:
    return json.loads(await kit.memory.call(lambda m: m.get_meta(FAILING_KEY)) or "{}")


async def _saved_failures(kit: Kit, n: int, since: float = 0.0) -> bool:
    saved = await _saved_failing(kit)
    return saved.get("failures", 0) >= n and saved.get("since", 0) >= since


@pytest.mark.parametrize("spell", [
    # Five failed calls in half a minute, then an eight-hour suspend: the first failed calls after
    # waking (network not up yet) must not make that "six hours and five failures".
    lambda now: {"since": now - 8 * 3600 - 30, "failures": 5, "last": now - 8 * 3600},
    # Saved by the previous version, without its last call: counts as such a gap.
    lambda now: {"since": now - 7 * 3600, "failures": 9},
], ids=["slept", "saved-without-last"])
async def test_a_gap_since_the_last_failed_call_restarts_the_failing_clock(kit: Kit, spell: Any) -> None:
    kit.bridge.faults.add(Fault("status", status=500, target="curator"))
    await kit.turns("old turn")  # timestamps in the test kit are long past
    now = time.time()
    await kit.memory.call(lambda m: m.set_meta(FAILING_KEY, json.dumps(spell(now))))
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()

    try:
        await wait_for(lambda: _saved_failures(kit, 3, since=now))  # counted again after the gap
        assert await _count(kit, "stale", 0)
        saved = await _saved_failing(kit)
        assert saved["last"] >= saved["since"]
    finally:
        await d.stop(flush_budget=0)


async def test_a_turn_whose_replies_are_always_unusable_is_isolated_and_marked_stale(kit: Kit) -> None:
    # The proxy and model worked a moment ago (the daemon finds that batch in memory.db at start):
    # unusable replies are then about the turns, not about the proxy.
    kit.bridge.curator.script("FACT: an earlier learning")
    await kit.processor.process(await kit.turns("turn 1"), "batch")
    kit.bridge.curator.script(*[refusing(5)] * 100)  # the model refuses whenever #5 is shown
    await kit.turns(*[f"turn {n}" for n in range(2, 8)])
    d = MemoryDaemon(kit.processor, batch_turns=25)
    with capture_logs() as logs:
        await d.start()
        try:
            await wait_for(lambda: _pending(kit, 0))
            assert await d.settle(60)
            assert await kit.transcript.call(lambda t: t.counts()) == {
                "pending": 0, "processed": 6, "stale": 1, "total": 7}
            batches = await kit.memory.call(lambda m: m.recent_batches(100))
            assert sorted(i for b in batches if b.status == "done" for i in b.observation_ids) == [1, 2, 3, 4, 6, 7]
            # the earlier batch; 2-7 three times, then one at a time: 2, 3, 4, 5 three times; then 6-7
            assert len(kit.bridge.curator_requests()) == 11
            await kit.turns("turn 8", "turn 9")  # newer turns are no longer held back
            d.trigger("test")
            await wait_for(lambda: _pending(kit, 0))
            assert await d.settle(60)
            assert await _count(kit, "processed", 8)
            assert d.status()["degraded"] is False and d.clock.since is None
        finally:
            await d.stop(flush_budget=0)
    [stale] = [x for x in logs if x["event"] == "observation_marked_stale"]
    assert stale["log_level"] == "error" and stale["observation_id"] == 5
    assert "turn 5" not in repr(stale)  # ids only, no user content


@pytest.mark.parametrize("poison", [2, 6])
async def test_a_poison_turn_is_isolated_on_a_sprite_with_no_success_yet(kit: Kit, poison: int) -> None:
    """No batch ever succeeded, so nothing says the model can answer: running the turns one at a
    time finds out (a turn that succeeds alone is the evidence), wherever the poison turn is."""
    kit.bridge.curator.script(*[refusing(poison)] * 100)
    await kit.turns(*[f"turn {n}" for n in range(1, 7)])  # ids 1-6: halves 1-3 and 4-6
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()
    try:
        await wait_for(lambda: _pending(kit, 0))
        assert await kit.transcript.call(lambda t: t.counts()) == {
            "pending": 0, "processed": 5, "stale": 1, "total": 6}
        [stale] = await kit.transcript.call(lambda t: [o.id for o in t.iter_all() if o.processed == STALE])
        assert stale == poison
    finally:
        await d.stop(flush_budget=0)


@pytest.mark.parametrize("last_success_age", [7200, 60])
async def test_unusable_replies_to_every_turn_try_each_alone_once_then_are_plain_failures(
        kit: Kit, last_success_age: float) -> None:
    # A misconfigured proxy or model: every call answered, nothing usable. A batch that worked
    # before (even a minute ago: the proxy may have broken since) says nothing about the turns:
    # each turn is tried alone once (a poison turn is one of them, and the others would succeed),
    # then plain failures.
    kit.bridge.curator.script("FACT: long ago")
    await kit.processor.process(await kit.turns("turn 0"), "batch")
    await kit.memory.call(lambda m: m.conn.execute("UPDATE batches SET created_at = ?",
                                                   (time.time() - last_success_age,)))
    kit.bridge.curator.default = "I can't help with that."
    await kit.turns(*[f"turn {n}" for n in range(1, 7)])  # ids 2-7
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()
    limit = UNUSABLE_LIMIT
    try:
        await wait_for(lambda: _requests(kit, 1 + 2 * limit + 6))
        await wait_for(lambda: _failures(d, limit))
        assert await _count(kit, "stale", 0) and await _pending(kit, 6)

        def which(text: str) -> str:
            shown = [n for n in range(2, 8) if f"[#{n}]" in text]
            return "whole" if shown == list(range(2, 8)) else f"#{shown[0]}" if len(shown) == 1 else repr(shown)

        seen = [which(r.last_user_text) for r in kit.bridge.curator_requests()[1:1 + 2 * limit + 6]]
        # whole, each turn alone once (none succeeds, so none is at fault), then whole again
        assert seen == ["whole"] * limit + [f"#{n}" for n in range(2, 8)] + ["whole"] * limit
        # a plain failure: the backoff grows, the six-hour clock runs, and no isolation again
        assert d.clock.since is not None and d.clock.next_retry_at is not None
        assert d.poison.queue == [] and d.poison.probed == 6  # not for these six turns
    finally:
        await d.stop(flush_budget=0)


@pytest.mark.parametrize(("poison", "calls", "probed"), [
    # One turn, always refused: it can't be told apart from a broken model, so it is a plain
    # failure, retried whole; that is no failed isolation.
    ((1,), 2 * UNUSABLE_LIMIT, 0),
    # Two, both refused: each fails alone, so no new isolation for these two.
    ((1, 2), UNUSABLE_LIMIT + 2, 2),
], ids=["lone", "pair"])
async def test_poison_turns_wait_for_newer_turns_then_are_isolated(
        kit: Kit, poison: tuple[int, ...], calls: int, probed: int) -> None:
    """Once newer (healthy) turns join the oldest chunk, one of them succeeds alone: the evidence."""
    kit.bridge.curator.script(*[refusing(*poison)] * 200)
    await kit.turns(*[f"turn {n}" for n in poison])
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()

    async def stalled() -> bool:
        return await _requests(kit, calls) and d.poison.probed == probed and not d.poison.queue

    try:
        await wait_for(stalled, timeout=30)
        assert await _count(kit, "stale", 0)
        await kit.turns("turn 3", "turn 4")
        d.trigger("test")
        await wait_for(lambda: _pending(kit, 0), timeout=60)
        assert await kit.transcript.call(lambda t: t.counts()) == {
            "pending": 0, "processed": 2, "stale": len(poison), "total": len(poison) + 2}
    finally:
        await d.stop(flush_budget=0)


async def test_a_waiter_is_not_told_curated_while_an_older_turn_is_set_aside(kit: Kit) -> None:
    kit.bridge.curator.script(*[refusing(1)] * 10)
    await kit.turns(*[f"turn {n}" for n in range(1, 7)])
    d = MemoryDaemon(kit.processor, batch_turns=25)  # not started: _drain is driven by hand
    verdicts = [d.poison.unusable([1, 2, 3, 4, 5, 6]) for _ in range(UNUSABLE_LIMIT)] + [d.poison.unusable([1])]
    assert verdicts[-2:] == [Verdict.ISOLATE, Verdict.SET_ASIDE]  # turn 1 failed alone: it goes last
    waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    d._waiters.append(daemon_module._Waiter(2, -1, waiter))  # a wait for every turn up to #2 curated
    ok, _ = await d._drain("test")  # 2 succeeds alone (the evidence), then 1 gets an unusable reply
    assert not ok and [o.id for o in await kit.processor.pending(10)] == [1, 3, 4, 5, 6]
    assert not waiter.done()  # turn 2 is curated, but turn 1 is not yet


def refusing(*poison: int) -> Callable[[RecordedRequest], str]:
    """A curator reply: a refusal whenever one of the `poison` turns is in the batch."""
    def reply(request: RecordedRequest) -> str:
        shown = any(f"[#{n}]" in request.last_user_text for n in poison)
        return "I can't help with that." if shown else "FACT: a learning"
    return reply


async def _requests(kit: Kit, n: int) -> bool:
    return len(kit.bridge.curator_requests()) >= n


async def test_a_proxy_returning_500_never_splits_or_marks_stale_before_six_hours(kit: Kit) -> None:
    kit.bridge.faults.add(Fault("status", status=500, target="curator", times=6))
    await kit.turns(*[f"turn {n}" for n in range(1, 7)])
    d = MemoryDaemon(kit.processor, batch_turns=25)
    await d.start()
    try:
        await wait_for(lambda: _pending(kit, 0), timeout=20)
    finally:
        await d.stop(flush_budget=0)
    assert await _count(kit, "stale", 0)
    batches = await kit.memory.call(lambda m: m.recent_batches(100))
    assert sum(b.status == "failed" for b in batches) == 6
    assert all(b.observation_ids == [1, 2, 3, 4, 5, 6] for b in batches)  # retried whole, never split
    assert all("[#1]" in r.last_user_text and "[#6]" in r.last_user_text for r in kit.bridge.curator_requests())


# ---------------------------------------------------------------- honest failure accounting


async def test_a_200_with_a_cut_off_body_is_a_failed_call_counted_saved_and_retried_on_schedule(
        kit: Kit, daemon: MemoryDaemon) -> None:
    assert await daemon.settle(60)
    kit.bridge.faults.add(Fault("malformed", target="curator"))  # HTTP 200, half a JSON body
    await kit.turns("hello")
    daemon.trigger("test")
    await wait_for(lambda: _saved_failures(kit, 3))  # each call counted, and the clock saved
    saved = await _saved_failing(kit)
    assert saved["next_retry_at"] - saved["last"] <= daemon.backoff.max
    assert "JSONDecodeError" in (daemon.health.last_error or "")
    kit.bridge.faults.clear()
    await wait_for(lambda: _pending(kit, 0))
    await wait_for(lambda: _failing_cleared(kit))
    requests = kit.bridge.curator_requests()
    batches = await kit.memory.call(lambda m: m.recent_batches(100))
    assert sum(b.status == "failed" for b in batches) == len(requests) - 1  # every failed call is in the books
    # On schedule: each wait at least the backoff's lower bound (jitter takes at most 20 % off).
    waits = [b.time - a.time for a, b in itertools.pairwise(requests)]
    floors = [0.8 * min(daemon.backoff.max, daemon.backoff.first * 2 ** n) for n in range(len(waits))]
    assert all(w >= f for w, f in zip(waits, floors, strict=True)), (waits, floors)


async def test_triggers_during_backoff_cause_no_early_call(kit: Kit, daemon: MemoryDaemon) -> None:
    assert await daemon.settle(60)
    # The retry comes 3.5 s after the failure, the budgets below are 1.5 s: the backoff still outlasts
    # them with a busy machine's second to spare (the six turns written meanwhile take some 25 ms), and
    # it ends before the proxy's first probe (PROBE_SOONEST, 5 s), so the retry is the backoff's alone.
    # The test waits it out once.
    daemon.backoff = Backoff(first=3.5, max=3.5, jitter=0.0)
    kit.bridge.faults.add(Fault("status", status=500, target="curator", times=1))
    await kit.turns("one")
    daemon.trigger("session-end")
    await wait_for(lambda: _failures(daemon, 1))
    announced = daemon.clock.next_retry_at
    assert announced is not None and daemon.status()["next_retry_at"] == announced
    for n in range(2, 8):  # turns, batch triggers, a session's end, all during the backoff
        await kit.turns(f"turn {n}")
        daemon.note_turn()
    daemon.trigger("session-end")
    started = time.monotonic()
    assert await daemon.flush("precompact", budget=1.5) is False  # the retry comes after its budget...
    assert await daemon.settle(1.5) is False
    assert time.monotonic() - started < 1.5  # ...so neither waits for it (waiting, one alone takes 1.5 s)
    assert len(kit.bridge.curator_requests()) == 1
    assert await daemon.flush("precompact", budget=60) is True  # this one waits for the retry
    _first, second, *rest = kit.bridge.curator_requests()
    assert second.time >= announced  # not before the backoff it announced (nor long after: it was waited for)
    assert rest == []  # the retry takes the seven turns in one call: the token cap allows it
    assert await _pending(kit, 0) and daemon.clock.failures == 0


async def test_any_error_of_a_run_counts_as_a_failed_call(kit: Kit, daemon: MemoryDaemon,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert await daemon.settle(60)

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(kit.processor, "process", broken)
    await kit.turns("one")
    daemon.trigger("test")
    await wait_for(lambda: _saved_failures(kit, 2))
    assert "a bug" in (daemon.health.last_error or "") and daemon.status()["next_retry_at"] is not None
    monkeypatch.undo()
    await wait_for(lambda: _pending(kit, 0))
    await wait_for(lambda: _failing_cleared(kit))


async def test_memory_status_and_healthz_give_the_same_time_for_the_last_success(
        kit: Kit, daemon: MemoryDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/healthz took the daemon's clock after the batch's files were written, memory status the batch's commit
    in memory.db: the same success a second apart, where an operator compares the two."""
    from sprite_os.commands.main import main

    await kit.turns("one")
    daemon.trigger("test")
    await wait_for(lambda: _pending(kit, 0))
    await daemon.stop(flush_budget=0)
    health = daemon.status()
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--workspace", str(tmp_path), "memory", "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert health["last_success_at"] is not None and report["last_success_at"] == health["last_success_at"]


async def test_memory_status_shows_what_healthz_shows_about_failing(
        kit: Kit, daemon: MemoryDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sprite_os.commands.main import main

    kit.bridge.faults.add(Fault("status", status=500, target="curator"))
    await kit.turns("one")
    daemon.trigger("test")
    await wait_for(lambda: _saved_failures(kit, 3))
    await daemon.stop(flush_budget=0)  # holds still while the two are compared
    health = daemon.status()
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--workspace", str(tmp_path), "memory", "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    failing = report["failing"]
    assert failing == {k: health[k] for k in ("consecutive_failures", "failing_since", "next_retry_at", "degraded")}
    assert report["last_success_at"] == health["last_success_at"]
    assert failing["consecutive_failures"] >= 3 and failing["degraded"] is True
    assert await asyncio.to_thread(main, ["--workspace", str(tmp_path), "memory", "status"]) == 0
    text = capsys.readouterr().out
    n = failing["consecutive_failures"]
    assert f"failing          since {time.strftime('%Y-%m-%d', time.gmtime(failing['failing_since']))}" in text
    assert f"{n} failed calls in a row (degraded); next retry " in text


# ---------------------------------------------------------------- the per-call token cap


async def test_a_batch_over_the_token_cap_is_split_into_calls_within_it(kit: Kit) -> None:
    await kit.turns(*[f"turn {n} " + "x" * 2_000 for n in range(1, 7)])  # ~2,050 characters each
    files = await asyncio.to_thread(kit.files.read_all)
    cap = estimate_tokens(fixed_chars(files, []) + 2 * 2_100)  # room for two of these turns, not three
    d = MemoryDaemon(kit.processor, batch_turns=25, batch_tokens=cap)
    await d.start()
    try:
        await wait_for(lambda: _pending(kit, 0))
        assert await d.settle(60)
    finally:
        await d.stop(flush_budget=0)
    batches = await kit.memory.call(lambda m: m.recent_batches(10))
    assert sorted(b.observation_ids for b in batches) == [[1, 2], [3, 4], [5, 6]]  # in order, each once
    requests = kit.bridge.curator_requests()
    assert len(requests) == 3
    assert all(estimate_tokens(len(SYSTEM) + len(r.last_user_text)) <= cap for r in requests)


# ---------------------------------------------------------------- catching up after an outage


async def test_once_the_proxy_answers_again_curation_resumes_long_before_the_backoff_ends(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage's backoff grows to minutes (memory stayed stale 210 s after the proxy came back).
    A cheap question to the proxy (a token count: no model call) brings the retry forward."""
    monkeypatch.setattr(daemon_module, "BACKOFF_FIRST", 300.0)
    monkeypatch.setattr(daemon_module, "BACKOFF_MAX", 300.0)
    d = MemoryDaemon(kit.processor, batch_turns=1)
    d.probe = Probe(every=0.3, soonest=0.1)
    port = kit.bridge.port
    await kit.bridge.stop()  # the proxy is down: the first call is refused, the next retry is 5 minutes off
    await kit.turns("during the outage")
    await d.start()
    try:
        await wait_for(lambda: d.clock.failures == 1, timeout=20, what="the failed call")
        assert d.clock.next_retry_at is not None and d.clock.next_retry_at - time.time() > 200
        await kit.bridge.start(port=port)
        kit.bridge.curator.script("FACT: curated after the outage [#1]")
        recovered = time.monotonic()
        await wait_for(lambda: _pending(kit, 0), timeout=30, what="curated after the proxy's return")
        assert time.monotonic() - recovered < 30
        assert [r.kind for r in kit.bridge.requests if r.target == "curator"][-1] == "messages"
        assert any(r.kind == "count_tokens" for r in kit.bridge.requests)  # the question, not a batch
    finally:
        await d.stop(flush_budget=0)


async def test_a_backlog_drains_in_chunks_as_large_as_the_token_cap_allows(kit: Kit) -> None:
    """A batch is triggered every `batch_turns` turns, but a backlog (after an outage, a long run)
    went out `batch_turns` turns per call: 1,219 turns pending after a 1,500-turn run."""
    await kit.turns(*(f"turn {n}" for n in range(80)))
    # A learning for each turn the call shows: a reply used to keep 60 at most, the rest lost with their turns curated.
    kit.bridge.curator.default = lambda request: "\n".join(
        f"FACT: what turn {n} said [#{n}]" for n in re.findall(r"^\[#(\d+)\]", request.last_user_text, re.MULTILINE))
    d = MemoryDaemon(kit.processor, batch_turns=3)
    await d.start()
    try:
        await wait_for(lambda: _pending(kit, 0), timeout=30)
    finally:
        await d.stop(flush_budget=0)
    assert len(kit.bridge.curator_requests()) == 1  # 80 short turns fit one call
    sources = await kit.memory.call(lambda m: [r[0] for r in m.conn.execute(
        "SELECT source_observation_id FROM learnings ORDER BY source_observation_id")])
    assert sources == await kit.transcript.call(lambda t: [r[0] for r in t.conn.execute(
        "SELECT id FROM observations ORDER BY id")])


async def test_a_forgets_pass_runs_between_a_backlogs_calls_not_after_the_last(kit: Kit) -> None:
    """A forget asks for its file pass; while a backlog drained (the proxy back after hours: call after call),
    the pass waited for the last call, and the forgotten turns' lines stayed in the memory files all along.
    It now runs between two calls, and once: its ask woke the daemon for a run of its own after the drain as
    well, the same pass twice (for a job the pass keeps, two passes that kept it: the retries came twice as fast
    up PASS_RETRY's steps). The forget asks from inside the first call (the curator's answer), not at a moment a
    poll catches, which a busy machine could let pass."""
    passes = 0
    calls_before: list[int] = []  # the curator calls made when each pass ran
    passes_when_asked: list[int] = []

    async def forget_pass() -> None:
        nonlocal passes
        passes += 1
        calls_before.append(len(kit.bridge.curator_requests()))

    def first_call_asks_for_the_pass(_request: RecordedRequest) -> str:
        if not passes_when_asked:
            passes_when_asked.append(passes)
            d.trigger(FORGET_PASS)
        return "NONE"

    await kit.turns(*(f"turn {n} " + "words " * 400 for n in range(4)))
    d = MemoryDaemon(kit.processor, batch_turns=3, batch_tokens=1)  # one turn a call
    d.before_batches = forget_pass
    kit.bridge.curator.default = first_call_asks_for_the_pass
    await d.start()
    try:
        await wait_for(lambda: _pending(kit, 0), timeout=30)
        await asyncio.wait_for(d._idle.wait(), 10)
        assert passes == 2, "the pass asked for between two calls ran again after the drain"
    finally:
        await d.stop(flush_budget=0)
    assert passes_when_asked == [1]  # the run's own pass, at its start, before the first call
    assert calls_before[:2] == [0, 1], "the pass waited for the backlog's later calls"
    assert len(kit.bridge.curator_requests()) == 4  # the backlog went on, a turn a call


async def test_a_locked_database_is_a_warning_not_a_traceback(kit: Kit, daemon: MemoryDaemon,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's `sqlite3 memory.db 'BEGIN EXCLUSIVE;'` is a condition of the machine, retried:
    it used to log an error with a traceback at every attempt."""
    import sqlite3

    assert await daemon.settle(10)
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5  # SQLITE_BUSY, as SQLite sets it
    bug = ValueError("a bug")

    async def process(*_a: Any, **_k: Any) -> None:
        raise errors.pop(0)

    errors = [locked, bug]
    monkeypatch.setattr(kit.processor, "process", process)
    await kit.turns("one")
    with capture_logs() as logs:
        daemon.trigger("test")
        await wait_for(lambda: _failures(daemon, 1))
        await wait_for(lambda: _failures(daemon, 2))  # the retry (a short backoff here) meets the bug
    failed = [x for x in logs if x["event"] == "memory_daemon_error"]
    assert failed[0]["log_level"] == "warning" and "exc_info" not in failed[0]
    assert failed[1]["log_level"] == "error" and failed[1]["exc_info"] is bug
