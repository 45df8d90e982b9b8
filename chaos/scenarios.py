"""The scenarios: each acts on the world (the running server, the proxy, the disk, the
databases) while turns go on, and returns its figures. The runner (chaos/run.py) starts the
server before each and settles, stops and checks after it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos import durability
from chaos.checks import journal_holds, pending_now, recorded_now
from chaos.turns import Turn
from chaos.world import World
from devkit.faults import exclusive_lock, fill
from devkit.harness import wait_for
from devkit.mock_bridge import Fault, RecordedRequest
from devkit.processes import Memory, ServerDied, child_cli_processes, memory_kib, workspace_clis
from sprite_os.paths import Layout


@dataclass(frozen=True)
class Plan:
    """How hard to push. The defaults are the full run; `smoke()` is the test suite's."""

    seed: int = 12
    kills: int = 12
    kill_turns: int = 120  # turns in the kill scenario, the kills among them
    freeze_seconds: float = 60.0
    lock_seconds: float = 30.0
    long_turns: int = 1500
    warmup_turns: int = 500  # the long run's private memory is bounded from here on (see RSS_GROWTH_BOUND)
    ack_kills: int = 50  # kill -9s right after turn_complete (kill_after_ack, slow_disk)
    power_cuts: int = 20
    slow_fsync: float = 0.1  # seconds each fsync takes on the slow disk
    io_turns: int = 12  # turns before the I/O error, given time to be curated
    io_last_turns: int = 3  # and turns right before it
    io_messages: int = 3  # messages sent once the disk is read-only
    io_wait: float = 10.0  # how long each of them is watched for an answer
    outage_seconds: float = 300.0
    phase_turns: int = 8  # turns per phase where latency is compared
    flaps: tuple[str, ...] = ()  # which proxy faults (FLAPS); () means all of them
    disk: Path | None = None  # the tmpfs the workspace is on (None: not root, no full disk)
    disk_skip: str = ""

    def __post_init__(self) -> None:
        if not self.flaps:
            object.__setattr__(self, "flaps", FLAPS)

    @classmethod
    def smoke(cls, **overrides: Any) -> Plan:
        values: dict[str, Any] = dict(kills=2, kill_turns=6, freeze_seconds=2.0, lock_seconds=3.0, long_turns=0,
                                      phase_turns=2, flaps=("agent:529", "agent:refused", "curator:cut_off_body"),
                                      ack_kills=1, power_cuts=1, io_turns=3, io_last_turns=1, io_messages=1, outage_seconds=5.0)
        values.update(overrides)
        return cls(**values)


Act = Callable[[World, Plan, random.Random], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Scenario:
    act: Act
    place: str = "shared"  # the suite's one workspace, or a fresh one of its own (chaos/places.py)


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else float("nan")


# ---------------------------------------------------------------- kill -9

KILL_MOMENTS = ("mid_turn", "curator_in_flight", "file_rewrite", "during_start")
# The open turn reaches the turn journal some time after turn_started (its first save waits 200 ms,
# then for the server's loop and capture's thread, which a busy machine holds up); a kill before then
# loses it by design, as no one was told it was done (docs/reliability.md). This long at most.
OPEN_TURN_ON_DISK_S = 60.0


async def _kill_mid_turn(world: World, group: bool, rng: random.Random) -> str:
    """A kill while the answer streams, once the open turn is on disk: the journal's replay is what
    this moment tests, so the kill never lands before the save that it replays (it did, when a fixed
    delay after turn_started had to cover the save on a busy machine, and the turn counted as lost)."""
    world.script_slow_turn()
    started = asyncio.Event()
    marker = world.log.next_marker
    task = asyncio.create_task(world.turn("a long answer, cut by a kill", started=started))
    await asyncio.wait_for(started.wait(), 120)
    await wait_for(lambda: journal_holds(world.workspace, marker) or task.done(), OPEN_TURN_ON_DISK_S,
                   interval=0.01, what=f"the open turn {marker} in the turn journal")
    await asyncio.sleep(rng.uniform(0.05, 2.0))
    await world.kill(group)
    await task
    return "mid_turn"


async def _turns_until(world: World, done: Callable[[], bool], most: int) -> None:
    for _ in range(most):
        await world.turn()
        for _ in range(20):
            if done():
                return
            await asyncio.sleep(0.05)
    raise TimeoutError("the condition never came")


async def _kill_curator_in_flight(world: World, group: bool, rng: random.Random) -> str:
    seen = len(world.bridge.curator_requests())
    world.bridge.faults.add(Fault("latency", seconds=4.0, target="curator", times=1))
    await _turns_until(world, lambda: any(r.status is None for r in world.bridge.curator_requests()[seen:]),
                       world.settings.batch_turns * 3)
    await asyncio.sleep(rng.uniform(0.0, 3.0))
    await world.kill(group)
    return "curator_in_flight"


def _kill_at_rewrite(dirs: list[Path], pid: int, group: bool, seconds: float) -> bool:
    """Poll the memory directory and the rewritten file's history (a thread: the loop's sleep is
    too coarse) and kill the server the moment a temp copy appears. False if none appeared
    within `seconds` (on a tmpfs a rewrite takes microseconds: it is often missed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for d in dirs:
            with contextlib.suppress(OSError):
                if any(n.endswith(".tmp") for n in os.listdir(d)):
                    (os.killpg if group else os.kill)(pid, signal.SIGKILL)
                    return True
    return False


async def _kill_file_rewrite(world: World, group: bool, rng: random.Random) -> str:
    seen = len(world.bridge.curator_requests())
    # The reply takes a little while, so the watcher is on before the rewrite starts.
    world.bridge.faults.add(Fault("latency", seconds=1.0, target="curator", times=1))
    for _ in range(world.settings.batch_turns * 3):
        await world.turn()
        if len(world.bridge.curator_requests()) > seen:
            break
    layout = Layout(world.workspace)
    watch = asyncio.to_thread(_kill_at_rewrite, [layout.memory_dir, layout.history_dir / "context.md"],
                              world.server_pid, group, 8.0)
    caught = await watch
    if not caught:
        await world.kill(group)
    else:
        world.kills += 1
        assert world.server is not None
        await world.server.wait()
        await world.drop_client()
    return "file_rewrite" if caught else "file_rewrite_missed"


async def _kill_during_start(world: World, group: bool, rng: random.Random) -> str:
    await world.kill(group)
    world.server = await world.new_server().spawn()
    await asyncio.sleep(rng.uniform(0.2, 6.0))  # before, during or just after the start's batch
    answered = False
    with contextlib.suppress(ServerDied):
        await world.server.healthy(0.05)
        answered = True
    await world.kill(group)
    return "during_start" if not answered else "just_after_start"


async def kills(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    moments: dict[str, int] = {}
    alone = group = 0
    most_clis = 0
    two_clis: list[int] = []
    start, killed = len(world.log.turns), world.kills
    between = max(1, (plan.kill_turns - plan.kills * 3) // max(1, plan.kills))
    for n in range(plan.kills):
        await world.turns(rng.randint(max(1, between // 2), between + 1))
        kind = KILL_MOMENTS[n % len(KILL_MOMENTS)]
        as_group = (n % 2 == 1) if n < 2 else rng.random() < 0.5
        act = {"mid_turn": _kill_mid_turn, "curator_in_flight": _kill_curator_in_flight,
               "file_rewrite": _kill_file_rewrite, "during_start": _kill_during_start}[kind]
        if world.server is None or not world.server.running:
            await world.start()
        got = await act(world, as_group, rng)
        moments[got] = moments.get(got, 0) + 1
        group, alone = group + as_group, alone + (not as_group)
        await world.start()
        await world.turn()  # the restarted server's CLI is up: it must be the only one in the workspace
        clis = workspace_clis(world.workspace)
        most_clis = max(most_clis, len(clis))
        if clis != child_cli_processes(world.server_pid):
            two_clis.append(len(clis))
    while len(world.log.turns) - start < plan.kill_turns:
        await world.turn()
    return {"kills": world.kills - killed, "alone": alone, "group": group, "moments": moments, "most_clis_at_once": most_clis,
            "restarts_with_a_stranger_cli": len(two_clis)}


# ---------------------------------------------------------------- a flapping proxy


async def _refused(world: World, seconds: float, during: Callable[[], Coroutine[Any, Any, Any]]) -> float:
    """The proxy down (connection refused) for `seconds` while `during` runs, then back on its
    port. Returns when it came back (wall clock), once `during` is done."""
    port = world.bridge.port
    await world.bridge.stop()
    task = asyncio.create_task(during())
    await asyncio.sleep(seconds)
    await world.bridge.start(port=port)
    back = time.time()
    await task
    return back


async def _append(into: list[Turn], turn: Awaitable[Turn]) -> None:
    into.append(await turn)


def _good(r: RecordedRequest) -> bool:
    """A curator call answered in full (a cut or malformed reply is sent with status 200)."""
    return r.status == 200 and not {"cut", "malformed"} & set(r.faults)


async def _recovered(world: World, seen: int, since: float | None = None, timeout: float = 120.0) -> float:
    """Seconds from the first curator call after `seen` (or from `since`) to the first that succeeded."""
    calls = world.bridge.curator_requests
    await world.bridge.wait_for(lambda _: any(_good(r) for r in calls()[seen:]), timeout)
    new = calls()[seen:]
    ok = next(r for r in new if _good(r))
    return round(ok.time - (new[0].time if since is None else since), 1)


AGENT_FAULTS = {"429": Fault("status", status=429, target="agent", times=1),
                "500": Fault("status", status=500, target="agent", times=1),
                "529": Fault("status", status=529, target="agent", times=2),
                "stream_cut": Fault("cut", after_events=3, target="agent", times=1)}
CURATOR_FAULTS = {"429": Fault("status", status=429, target="curator", times=1),
                  "500": Fault("status", status=500, target="curator", times=1),
                  "529": Fault("status", status=529, target="curator", times=1),
                  "stream_cut": Fault("cut", target="curator", times=1),
                  "cut_off_body": Fault("malformed", target="curator", times=1)}
FLAPS = (*(f"agent:{k}" for k in AGENT_FAULTS), "agent:refused", *(f"curator:{k}" for k in CURATOR_FAULTS),
         "curator:refused")


async def flapping(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    bridge, b = world.bridge, world.settings.batch_turns
    n = max(plan.phase_turns, b)
    normal = [t.seconds for t in await world.turns(n) if t.outcome == "completed"]
    agent: dict[str, str] = {}
    for label, fault in AGENT_FAULTS.items():
        if f"agent:{label}" in plan.flaps:
            fault = bridge.faults.add(dataclasses.replace(fault))  # a fresh count of uses
            agent[label] = (await world.turn(f"through a proxy answering {label}")).outcome
            bridge.faults.remove(fault)
    if "agent:refused" in plan.flaps:
        refused: list[Turn] = []
        await _refused(world, 3.0, lambda: _append(refused, world.turn("through a proxy that is down")))
        agent["refused"] = refused[0].outcome
    curator_failed_before = sum(not _good(r) for r in bridge.curator_requests())
    curator: dict[str, float] = {}  # fault -> seconds from the failed call to the next good one
    for label, fault in CURATOR_FAULTS.items():
        if f"curator:{label}" in plan.flaps:
            seen = len(bridge.curator_requests())
            fault = bridge.faults.add(dataclasses.replace(fault))
            await world.turns(b)  # a batch: it fails, and is retried after the daemon's first backoff
            curator[label] = await _recovered(world, seen)
            bridge.faults.remove(fault)
    if "curator:refused" in plan.flaps:
        seen = len(bridge.curator_requests())
        back = await _refused(world, 3.0, world.new_session)  # the session's end asks for a batch: nobody answers
        await world.turns(b)
        curator["refused"] = await _recovered(world, seen, since=back)  # from the proxy's return
    outage = bridge.faults.add(Fault("status", status=529, target="curator"))
    during = [t.seconds for t in await world.turns(n) if t.outcome == "completed"]
    bridge.faults.remove(outage)
    await world.turns(b)  # recovery
    return {"agent_outcomes": agent,
            "agent_retries_announced": len([f for f in world.frames() if f["type"] == "model_retry"]),
            "curator_failed_calls": sum(not _good(r) for r in bridge.curator_requests()) - curator_failed_before,
            "curator_recovered_after_s": curator,
            "normal_median_s": median(normal), "curator_outage_median_s": median(during),
            "latency_ratio": round(median(during) / median(normal), 2) if normal and during else None}


# ---------------------------------------------------------------- freeze and thaw


async def freeze(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    await world.turns(2)
    world.script_slow_turn(words=200, delay=0.02)
    seen = len(world.frames())
    started = asyncio.Event()
    task = asyncio.create_task(world.turn("frozen mid-answer", started=started))
    await asyncio.wait_for(started.wait(), 60)
    await wait_for(lambda: any(f["type"] == "text_delta" for f in world.frames()[seen:]), 60,
                   what="the answer streaming")  # the turn's task reads the frames
    stopped = [world.server_pid, *child_cli_processes(world.server_pid)]
    os.killpg(world.server_pid, signal.SIGSTOP)  # the server, its CLI and what the CLI runs
    await asyncio.sleep(plan.freeze_seconds)
    os.killpg(world.server_pid, signal.SIGCONT)
    frozen = await task
    after = await world.turns(3)
    return {"frozen_s": plan.freeze_seconds, "processes_frozen": len(stopped), "frozen_turn": frozen.outcome,
            "frozen_turn_s": round(frozen.seconds, 1), "turns_after": [t.outcome for t in after]}


# ---------------------------------------------------------------- a full disk


async def full_disk(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    if plan.disk is None:
        return {"skipped": plan.disk_skip or "no tmpfs"}
    await world.turns(2)
    filler = await asyncio.to_thread(fill, plan.disk)
    try:
        during = await world.turns(max(4, world.settings.batch_turns + 1), "x" * 20_000)  # each needs new pages
        await asyncio.sleep(5.0)
        held = len({t.marker for t in during} & recorded_now(world.workspace))
    finally:
        filler.unlink()
    freed = time.monotonic()
    await wait_for(lambda: {t.marker for t in during} <= recorded_now(world.workspace), 120, interval=0.2,
                   what="the turns written once the disk was freed")
    landed = time.monotonic() - freed
    after = await world.turns(2)
    return {"turns_while_full": [t.outcome for t in during], "recorded_while_full": held,
            "landed_after_free_s": round(landed, 1), "turns_after": [t.outcome for t in after]}


# ---------------------------------------------------------------- a locked database


async def locked(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    layout = Layout(world.workspace)
    b = world.settings.batch_turns
    normal = [t.seconds for t in await world.turns(max(plan.phase_turns, b)) if t.outcome == "completed"]
    out: dict[str, Any] = {}
    for name, db in (("transcript.db", layout.transcript_db), ("memory.db", layout.memory_db)):
        async with exclusive_lock(db):
            began = time.monotonic()
            done = []
            while time.monotonic() - began < plan.lock_seconds:  # turns, and batches among them
                done.append(await world.turn(f"while {name} is locked"))
                await asyncio.sleep(0.5)
        released = time.monotonic()
        sent = {t.marker for t in done}
        await wait_for(lambda sent=sent: sent <= recorded_now(world.workspace), 120, interval=0.2,
                       what=f"the turns written once {name} was released")
        out[name] = {"turns_while_locked": len(done),
                     "completed": sum(t.outcome == "completed" for t in done),
                     "landed_after_release_s": round(time.monotonic() - released, 1),
                     "median_s": median([t.seconds for t in done if t.outcome == "completed"])}
    during = out["memory.db"]["median_s"]
    out["normal_median_s"] = median(normal)
    out["latency_ratio"] = round(during / median(normal), 2) if normal else None  # the curator failing on the lock
    await world.turns(b)
    return out


# ---------------------------------------------------------------- a long run


# After warm-up, the server's private memory (RssAnon: the heap, malloc's arenas, Python's
# objects) ends at most this much above the highest it reached during warm-up. Measured
# (2026-11-25, tracemalloc and /proc/<pid>/smaps): the Python objects still alive grew ~1 KiB a
# turn, all bounded (the replay buffer to its cap, timing samples) or the memory's own data (the
# recall index's vectors); SQLite's page caches fill towards their 2 MB a connection (2.4 MiB at
# turn 200, 4.9 at 700, 5.1 at 1,200). So it rises to about turn 500, then holds: two 1,500-turn
# runs went 140-149 MiB to turn 400, 149-157 at turn 500, 152-155 at the end, with single samples
# up to 164 (the heap's top comes and goes by ~10 MiB, hence the median of the last samples): 0
# and 3 % above the warm-up's peak. The whole RSS also grows by the embedding model's file pages
# (see devkit.processes.Memory: 77 to 116 MiB of mapped files, flat from turn 1,100): reported,
# not bounded, since the files' size bounds it.
RSS_GROWTH_BOUND = 0.10
SETTLED_SAMPLES = 5  # the run's end: the median of its last 5 samples (250 turns)
DRAIN_BOUND_S = 120.0  # the backlog left by the run is curated within this long of its end


def private_growth(anon_kib: dict[int, int], warmup: int) -> float | None:
    """How far the private memory ended (the median of the last samples after turn `warmup`)
    above the highest it reached up to then, 0 if not above; None if no sample came after it."""
    warm = max((kib for n, kib in anon_kib.items() if n <= warmup), default=0)
    after = [kib for n, kib in sorted(anon_kib.items()) if n > warmup]
    if not warm or not after:
        return None
    return max(0.0, statistics.median(after[-SETTLED_SAMPLES:]) / warm - 1)


async def long_run(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    if plan.long_turns <= 0:
        return {"skipped": "no long run in this plan"}
    memory: dict[int, Memory] = {}  # turn -> the server's memory (not its CLI's), every 50 turns
    first = time.monotonic()
    for n in range(1, plan.long_turns + 1):
        await world.turn()
        if n % 50 == 0 or n == plan.long_turns:
            memory[n] = memory_kib(world.server_pid)
    backlog = pending_now(world.workspace)  # turns the curator has yet to reach when the run ends
    ended = time.monotonic()
    await world.new_session()  # the session's end asks for a batch, as a person leaving would
    with contextlib.suppress(TimeoutError):
        await wait_for(lambda: pending_now(world.workspace) == 0, 900, interval=0.5)
    drained = round(time.monotonic() - ended, 1) if pending_now(world.workspace) == 0 else None
    seconds = world.log.seconds(world.scenario)
    shown = [n for n in memory if n % 100 == 0 or n == plan.long_turns]  # every 100 turns in the table
    out: dict[str, Any] = {"turns": plan.long_turns, "seconds": round(ended - first, 1),
                           "median_s": median(seconds), "first_50_median_s": median(seconds[:50]),
                           "last_50_median_s": median(seconds[-50:]), "curator_backlog_at_end": backlog,
                           "backlog_drained_s": drained,
                           "rss_mib": {n: round(memory[n].rss / 1024) for n in shown},
                           "private_mib": {n: round(memory[n].anon / 1024) for n in shown},
                           "mapped_files_mib": {n: round(memory[n].file / 1024) for n in shown}}
    missed = []
    growth = private_growth({n: m.anon for n, m in memory.items()}, plan.warmup_turns)
    if growth is not None:
        out["private_growth_after_warmup"] = round(growth, 3)
        if growth > RSS_GROWTH_BOUND:
            missed.append(f"private memory ended {growth:.0%} above its warm-up peak (turn {plan.warmup_turns}; "
                          f"bound {RSS_GROWTH_BOUND:.0%})")
    if drained is None or drained > DRAIN_BOUND_S:
        missed.append(f"a backlog of {backlog} drained in {drained if drained is not None else 'more than 900'} s "
                      f"(bound {DRAIN_BOUND_S:g} s)")
    if missed:
        out["missed"] = missed
    return out


SCENARIOS: dict[str, Scenario] = {
    "kill9": Scenario(kills), "flapping_proxy": Scenario(flapping), "freeze": Scenario(freeze),
    "full_disk": Scenario(full_disk), "locked_db": Scenario(locked),
    "kill_after_ack": Scenario(durability.kill_after_ack),
    "slow_disk": Scenario(durability.slow_disk, "slow_disk"),
    "power_loss": Scenario(durability.power_loss, "lazy"),
    "io_error": Scenario(durability.io_error, "ext4"),
    "second_server": Scenario(durability.second_server, "deployed"),
    "proxy_outage": Scenario(durability.proxy_outage),
    "long_run": Scenario(long_run)}
# Run by the test suite in miniature (tests/test_chaos_smoke.py), on one workspace.
SMOKE = ("kill9", "flapping_proxy", "freeze", "full_disk", "locked_db")
