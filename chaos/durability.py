"""The scenarios about the promise that matters most: a turn the person saw complete is kept.
A kill -9 the moment the client reads `turn_complete` (on the suite's disk, on a slow one), a
power cut then, an I/O error that remounts the workspace read-only, a second server started on
a deployed workspace mid-turn, a five-minute proxy outage. Each returns its figures, and under
`missed` the bounds it did not meet (the runner counts them as failures)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from typing import TYPE_CHECKING, Any

from chaos.checks import pending_now
from chaos.turns import Outcome, Turn
from chaos.world import TURN_TIMEOUT, World
from devkit.deploy_support import healthz
from devkit.faults import LazyDisk, LoopExt4
from devkit.harness import wait_for
from devkit.processes import workspace_clis
from sprite_os.paths import Layout

if TYPE_CHECKING:  # scenarios.py lists these scenarios and defines the plan
    from chaos.scenarios import Plan

FAST_TURN_S = 0.05  # a short turn (the server's duration_ms): the kill must land on these too, where writes lag most
KILL_WITHIN_MS = 1.0  # from the client reading turn_complete to the kill
ERROR_WITHIN_S = 5.0  # each message on a read-only disk gets an error this soon
CAUGHT_UP_WITHIN_S = 30.0  # pending turns curated this soon after the proxy is back


def _spread(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3), "max": round(max(xs), 3)} if xs else {}


# ---------------------------------------------------------------- kill -9 (and power off) after the acknowledgement


async def _kills_after_ack(world: World, count: int, rng: random.Random, *, power_off: bool,
                           fast_ones: bool = True) -> dict[str, Any]:
    """`count` times: a few turns, then one more whose turn_complete the client reads and at once
    (no await in between) kills the server, alone or with its process group, and with
    `power_off` cuts the power too (every unsynced write gone); then a restart."""
    disk: LazyDisk | None = world.disk if power_off else None
    delays: list[float] = []  # ms from the client reading turn_complete to the kill's return
    durations: list[int] = []  # the killed turns' own length (turn_complete's duration_ms)
    killed: list[Turn] = []
    alone = n = 0
    # A kill that landed late (the machine busy elsewhere) is done again, up to as many again as asked.
    while sum(d <= KILL_WITHIN_MS for d in delays) < count and n < 2 * count + 10:
        n += 1
        if world.server is None or not world.server.running:
            await world.start()
        await world.turns(rng.randint(0, 2))  # the first turn of a session starts a CLI; later ones are fast
        group = power_off or n % 2 == 0
        alone += not group

        def kill(frame: dict[str, Any], group: bool = group) -> None:
            read = time.perf_counter()
            world.kill_now(group)
            delays.append((time.perf_counter() - read) * 1000)
            if disk is not None:
                disk.power_off()
            durations.append(int(frame["duration_ms"]))

        turn = await world.turn("acknowledged, then a kill", completed=kill)
        killed.append(turn)
        if world.server is not None and world.server.running and turn.outcome != "completed":
            await world.kill(group)  # the turn did not complete (none to kill after): still a restart
        await world.reap()
        if disk is not None:
            await asyncio.to_thread(disk.power_on)
    await world.start()
    fast = [ms for ms in durations if ms < FAST_TURN_S * 1000]
    out: dict[str, Any] = {
        "kills": n, "alone": alone, "group": n - alone,
        "kills_within_1ms": sum(d <= KILL_WITHIN_MS for d in delays),
        "outcomes": dict(world.log.outcomes(world.scenario)),  # every turn of the scenario, the killed among them
        "kill_after_read_ms": _spread(delays),
        "killed_turn_ms": _spread([float(ms) for ms in durations]),
        "client_turn_s": _spread([t.seconds for t in killed if t.outcome == "completed"]),
        "killed_turns_under_50ms": len(fast)}
    missed = []
    if (within := sum(d <= KILL_WITHIN_MS for d in delays)) < count:
        missed.append(f"{within} of {count} kills landed within {KILL_WITHIN_MS:g} ms of reading turn_complete")
    if fast_ones and count >= 10 and not fast:  # a miniature run (one kill) can't promise one
        missed.append("no killed turn was under 50 ms")
    if disk is not None:
        out["power_cuts"] = disk.power_cuts
    if missed:
        out["missed"] = missed
    return out


async def kill_after_ack(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    return await _kills_after_ack(world, plan.ack_kills, rng, power_off=False)


async def slow_disk(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    """The same kills, with each fsync held `plan.slow_fsync` s (a slow cloud or SD disk)."""
    disk: LazyDisk = world.disk
    out = await _kills_after_ack(world, plan.ack_kills, rng, power_off=False)
    return {"fsync_delay_s": disk.fsync_delay, **out, "disk": disk.stats()}


async def power_loss(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    """The same moment, but the power goes: the server and everything it started are killed and
    every write not fsynced is dropped (devkit/lazyfs.py)."""
    disk: LazyDisk = world.disk
    out = await _kills_after_ack(world, plan.power_cuts, rng, power_off=True, fast_ones=False)
    return {**out, "disk": disk.stats()}


# ---------------------------------------------------------------- an I/O error remounts the workspace read-only


async def _message_on_a_broken_disk(world: World, wait: float) -> tuple[Outcome, float | None, str]:
    """One message once the disk is read-only: what the client got and how soon (seconds to the
    first error frame or failed turn, None if none came within `wait`)."""
    assert world.client is not None
    c = world.client
    marker = world.log.new_marker()
    text = f"{marker} sent while the disk is read-only"
    began = time.monotonic()
    outcome: Outcome = "unsent"
    answered: float | None = None
    how = "nothing"
    with contextlib.suppress(TimeoutError):
        await c.send(type="user_message", text=text)
        async with asyncio.timeout(wait):
            turn_id = None
            while answered is None:
                frame = await c.recv(wait)
                if frame["type"] == "turn_started" and frame["text"] == text:
                    turn_id, outcome = frame["turn_id"], "cut"
                elif frame["type"] == "error" and frame.get("turn_id") in (None, turn_id):
                    answered, how = time.monotonic() - began, f"error {frame['code']}"
                    outcome = "error" if turn_id else outcome
                elif frame["type"] == "turn_complete" and frame["turn_id"] == turn_id:
                    outcome = frame["status"]
                    if outcome != "completed":
                        answered, how = time.monotonic() - began, f"turn_complete {outcome}"
                    else:
                        how = "turn_complete completed"
    world.log.add(Turn(marker, world.scenario, outcome, time.monotonic() - began, kept=False))
    return outcome, None if answered is None else round(answered, 2), how


async def io_error(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    disk: LoopExt4 = world.disk
    layout = Layout(world.workspace)
    before = await world.turns(plan.io_turns)
    with contextlib.suppress(TimeoutError):  # curated before the error, and in ext4's journal (it commits every 5 s)
        await wait_for(lambda: pending_now(world.workspace) == 0, 30, interval=0.5)
    curated_before = plan.io_turns - max(0, pending_now(world.workspace))
    before += await world.turns(plan.io_last_turns)  # and some the person saw complete just before the error
    disk.trigger_error()
    await wait_for(lambda: disk.read_only, 10, what="the kernel remounting the workspace read-only")
    answers = [await _message_on_a_broken_disk(world, max(ERROR_WITHIN_S, plan.io_wait)) for _ in range(plan.io_messages)]
    assert world.server is not None
    health = await asyncio.to_thread(healthz, world.server.port, None, 5.0)
    token = layout.os_dir / "token"
    full = await asyncio.to_thread(healthz, world.server.port, world.workspace, 5.0) if token.exists() else None
    stopped = time.monotonic()
    await world.stop()
    exit_code = world.server.proc.returncode if world.server.proc is not None else None
    stop_s = round(time.monotonic() - stopped, 1)
    await wait_for(lambda: not workspace_clis(world.workspace), 30, what="no CLI left on the broken disk")
    fsck = await asyncio.to_thread(disk.repair)
    await world.start()
    out: dict[str, Any] = {
        "turns_before": len(before), "curated_before": curated_before,
        "messages": [{"outcome": o, "error_after_s": s, "got": how} for o, s, how in answers],
        "healthz": {"status": (health or {}).get("status"),
                    "agent": (full or {}).get("agent", {}).get("state"),
                    "queued": (full or {}).get("agent", {}).get("queued_messages")},
        "sigterm": {"exit": exit_code, "seconds": stop_s}, "fsck_exit": fsck}
    late = [s for _, s, _ in answers if s is None or s > ERROR_WITHIN_S]
    missed = []
    if late:
        missed.append(f"{len(late)} of {len(answers)} messages got no error within {ERROR_WITHIN_S:g} s")
    if exit_code != 0:
        missed.append(f"SIGTERM on the read-only disk: exit {exit_code}")
    if missed:
        out["missed"] = missed
    return out


# ---------------------------------------------------------------- a second server on a deployed workspace


async def second_server(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    """While the first streams a turn, a second server starts on the same deployed workspace: it
    must refuse without touching anything, and the first's turn must complete."""
    isolation = Layout(world.workspace).state_dir / "isolation.json"
    await world.turns(2)
    before = (isolation.read_bytes(), isolation.stat().st_mtime_ns)
    world.script_slow_turn(words=1500, delay=0.02)  # about 30 s of streaming: the second's start is slow under load
    started = asyncio.Event()
    seen = len(world.frames())
    task = asyncio.create_task(world.turn("streaming while a second server starts", started=started))
    await asyncio.wait_for(started.wait(), 120)
    await wait_for(lambda: any(f["type"] == "text_delta" for f in world.frames()[seen:]), 60,
                   what="the first server's answer streaming")
    second = await world.new_server().spawn()
    try:
        code: int | None = await second.wait(60)
    except TimeoutError:
        code = None  # it is serving: two servers on one workspace
    finally:
        await second.stop()
    overlapped = not task.done()  # the second server was done while the first's turn went on
    first = await task
    after = (isolation.read_bytes(), isolation.stat().st_mtime_ns)
    next_turn = await world.turn()
    said = [line for line in second.log.read_text(errors="replace").splitlines() if line.strip()]
    out: dict[str, Any] = {"second_exit": code, "second_said": said[-1][-200:] if said else "",
                           "first_turn": first.outcome, "first_turn_s": round(first.seconds, 1),
                           "second_done_mid_turn": overlapped,
                           "isolation_json_unchanged": after == before, "turn_after": next_turn.outcome}
    missed = []
    if code is None or code == 0:
        missed.append("the second server did not refuse")
    if first.outcome != "completed":
        missed.append(f"the first server's turn ended {first.outcome}")
    if not overlapped and first.outcome == "completed":  # the fault never met the turn: nothing was shown
        missed.append("the second server was still starting when the first's turn ended (no overlap)")
    if after != before:
        missed.append("the refused start rewrote isolation.json")
    if missed:
        out["missed"] = missed
    return out


# ---------------------------------------------------------------- the proxy down for minutes


async def proxy_outage(world: World, plan: Plan, rng: random.Random) -> dict[str, Any]:
    """The model proxy refuses every connection for `plan.outage_seconds`, with turns pending and
    one sent meanwhile (its end asks for a batch, refused); once it is back, every pending turn
    must be curated within 30 s."""
    bridge, b = world.bridge, world.settings.batch_turns
    with contextlib.suppress(TimeoutError):  # start from nothing pending
        await wait_for(lambda: pending_now(world.workspace) == 0, 120, interval=0.5)
    await world.turns(b - 1)  # fewer than a batch: they wait for the next trigger
    port = bridge.port
    await bridge.stop()
    down = time.monotonic()
    during = asyncio.create_task(world.turn("while the proxy is down",  # the CLI retries, then gives up
                                            timeout=plan.outage_seconds + TURN_TIMEOUT))
    await asyncio.sleep(max(0.0, plan.outage_seconds - (time.monotonic() - down)))
    pending = pending_now(world.workspace)
    await bridge.start(port=port)
    back = time.monotonic()
    during_turn = await during  # one client, one turn at a time: it may end only now, answered
    after = await world.turn("the proxy is back")
    with contextlib.suppress(TimeoutError):
        await wait_for(lambda: pending_now(world.workspace) == 0, max(120.0, plan.outage_seconds), interval=0.25)
    caught_up = pending_now(world.workspace) == 0
    seconds = round(time.monotonic() - back, 1)
    out: dict[str, Any] = {"outage_s": round(back - down), "pending_at_recovery": pending,
                           "turn_during": during_turn.outcome, "turn_after": after.outcome,
                           "curated_after_recovery_s": seconds if caught_up else None}
    if not caught_up or seconds > CAUGHT_UP_WITHIN_S:
        out["missed"] = [f"pending turns curated {seconds if caught_up else 'not'} s after the proxy came back "
                         f"(bound {CAUGHT_UP_WITHIN_S:g} s)"]
    return out
