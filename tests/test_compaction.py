"""CompactionHooks: PreCompact waits for the flush (within its budget); SessionStart(compact) re-injects."""

import asyncio
import time

from devkit.mock_bridge import Fault
from sprite_os.memory.curation.daemon import MemoryDaemon
from sprite_os.memory.hooks import CompactionHooks, HookTimings
from tests.test_processor import Kit
from tests.test_processor import kit as kit


class BlockingFlush:
    """A daemon flush that finishes only when the test sets `release`; honours the budget like
    MemoryDaemon.flush (asyncio.wait_for on the batch), so a flush that never completes times out."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[tuple[str, float]] = []
        self.finished = False

    async def __call__(self, reason: str, budget: float) -> bool:
        self.calls.append((reason, budget))
        try:
            await asyncio.wait_for(self.release.wait(), budget)
        except TimeoutError:
            return False
        self.finished = True
        return True


async def refresh() -> str:
    return "# fresh memory"


async def test_pre_compact_returns_only_after_the_flush_completes() -> None:
    flush = BlockingFlush()
    hooks = CompactionHooks(flush, refresh, budget=30.0, timings=HookTimings())
    call = asyncio.create_task(hooks.on_pre_compact({"trigger": "auto"}, None, None))
    for _ in range(20):  # plenty of loop turns: a hook that only triggered the flush would be done
        await asyncio.sleep(0.01)
    assert not call.done(), "PreCompact returned before its flush completed"
    assert flush.calls == [("precompact-auto", 30.0)]
    flush.release.set()
    assert await asyncio.wait_for(call, 60) == {}
    assert flush.finished


async def test_pre_compact_gives_up_within_its_budget_when_the_flush_never_completes() -> None:
    flush = BlockingFlush()  # never released
    timings = HookTimings()
    hooks = CompactionHooks(flush, refresh, budget=0.2, timings=timings)
    started = time.monotonic()
    assert await asyncio.wait_for(hooks.on_pre_compact({"trigger": "manual"}, None, None), 5) == {}
    elapsed = time.monotonic() - started
    assert 0.15 <= elapsed < 5, elapsed  # it waited for the budget, and gave up (the flush never ends)
    assert flush.calls == [("precompact-manual", 0.2)] and not flush.finished
    assert timings.errors == 0 and len(timings.samples_ns) == 1


async def test_pre_compact_with_the_real_daemon_waits_for_the_batch_and_is_bounded_by_the_budget(kit: Kit) -> None:
    daemon = MemoryDaemon(kit.processor, batch_turns=25)
    await daemon.start()
    try:
        assert await daemon.settle(60)
        await kit.turns("the garden plan is due in May")
        # Half a second: the mock's curator answers in milliseconds otherwise, so a hook that did not wait
        # for the call is told from one that did.
        kit.bridge.faults.add(Fault("latency", seconds=0.5, target="curator", times=1))
        hooks = CompactionHooks(daemon.flush, refresh, budget=60.0, timings=HookTimings())
        started = time.monotonic()
        await hooks.on_pre_compact({"trigger": "auto"}, None, None)
        assert time.monotonic() - started >= 0.45  # it waited for the slow curator call...
        assert (await kit.transcript.call(lambda t: t.counts()))["pending"] == 0  # ...which then finished
        [batch] = await kit.memory.call(lambda m: m.recent_batches(5))
        assert (batch.trigger, batch.status) == ("precompact-auto", "done")
        # A curator that never answers in time: the hook gives up at its budget.
        await kit.turns("then the soil")
        kit.bridge.faults.add(Fault("latency", seconds=30.0, target="curator", times=1))
        hooks = CompactionHooks(daemon.flush, refresh, budget=0.3, timings=HookTimings())
        started = time.monotonic()
        assert await hooks.on_pre_compact({"trigger": "manual"}, None, None) == {}
        assert time.monotonic() - started < 20  # at its budget, not at the 30 s answer
        assert (await kit.transcript.call(lambda t: t.counts()))["pending"] == 1
    finally:
        await daemon.stop(flush_budget=0)


async def test_pre_compact_fails_open_when_the_flush_raises() -> None:
    async def broken(reason: str, budget: float) -> bool:
        raise RuntimeError("daemon gone")

    timings = HookTimings()
    hooks = CompactionHooks(broken, refresh, budget=1.0, timings=timings)
    assert await hooks.on_pre_compact({"trigger": "auto"}, None, None) == {}
    assert timings.errors == 1


async def test_session_start_reinjects_memory_only_after_a_compaction() -> None:
    flush = BlockingFlush()
    hooks = CompactionHooks(flush, refresh, budget=1.0, timings=HookTimings())
    assert await hooks.on_session_start({"source": "startup"}, None, None) == {}
    assert await hooks.on_session_start({"source": "compact"}, None, None) == {
        "hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "# fresh memory"}}
