"""Runs the scenarios in order against one workspace and one conversation, settling, stopping and
checking after each (the invariants are cumulative: a later scenario also answers for the turns of
the earlier ones), and formats the results."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checks import Invariants, check, pending_now
from chaos.places import place
from chaos.scenarios import SCENARIOS, Plan
from chaos.world import Settings, World
from devkit.faults import FaultSetupFailed, small_tmpfs
from devkit.harness import wait_for
from devkit.mock_bridge import MockBridge

OWN_MARKERS = 200_000  # a scenario on its own workspace numbers its markers from here (n * 10,000 on)
SETTLE_TIMEOUT = 420.0  # above the daemon's longest backoff (300 s) after a flapping curator
DISK_SIZE = "160m"


@dataclass
class Result:
    name: str
    seconds: float
    turns: int  # turns this scenario sent
    figures: dict[str, Any] = field(default_factory=dict)
    invariants: Invariants | None = None  # None: counted with a later scenario (settle_each=False), or skipped
    error: str | None = None
    missed: list[str] = field(default_factory=list)  # the scenario's own bounds it did not meet
    skipped: str | None = None  # why it could not run here (no root, no FUSE, no loop device)

    def failures(self) -> list[str]:
        return (([self.error] if self.error else []) + self.missed
                + (self.invariants.failures() if self.invariants else []))

    @property
    def ok(self) -> bool:
        return not self.failures()

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "seconds": self.seconds, "turns": self.turns,
                "figures": self.figures, "error": self.error, "missed": self.missed, "skipped": self.skipped,
                "invariants": self.invariants.as_json() if self.invariants else None}


def short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 4 and len(set(map(str, value))) == 1:
        return f"{len(value)}x {value[0]}"
    return str(value)


def line(r: Result) -> str:
    """One line per scenario, with its figures."""
    head = f"{r.name:<15} {'ok ' if r.ok else 'FAIL'} {r.seconds:6.0f} s  "
    if r.skipped is not None:
        return head + f"skipped: {r.skipped}"
    if r.invariants is None:
        return head + f"{r.turns} turns, counted with a later scenario | " + ", ".join(
            f"{k} {short(v)}" for k, v in r.figures.items()) + (f" | FAILED: {r.error}" if r.error else "")
    i, t = r.invariants, r.invariants.turns
    text = (f"{r.turns} turns; all so far: {t.completed} completed, {t.cut} cut by a kill ({t.cut_recorded} recorded "
            f"from the journal), {t.unsent} unsent ({t.unsent_recorded} recorded); {i.observations} observations: "
            f"{len(t.lost)} lost, {len(t.duplicated)} duplicated; curated once {i.curated_once}/{i.observations}, "
            f"{len(i.learning_duplicates)} duplicate learnings, {len(i.batch_duplicates)} re-run turns; integrity "
            f"{'/'.join(i.integrity.values())}; files {'ok' if not i.bad_files else i.bad_files}; "
            f"debris {len(i.debris)}; orphan CLIs {len(i.orphans)} | "
            + ", ".join(f"{k} {short(v)}" for k, v in r.figures.items()))
    if r.failures():
        text += " | FAILED: " + "; ".join(r.failures())
    return head + text


async def settle(world: World, timeout: float = SETTLE_TIMEOUT) -> None:
    """End the session (a batch of what is pending), wait until every turn is curated, stop."""
    if world.server is None or not world.server.running:
        await world.start()  # a start asks for a batch of what is pending
    kinds = [f["type"] for f in world.frames()]
    if "session_started" in kinds:  # the current session's frames
        kinds = kinds[len(kinds) - 1 - kinds[::-1].index("session_started"):]
    if "turn_started" in kinds:  # a session with turns is open: its end asks for a batch
        await world.new_session()
    await wait_for(lambda: pending_now(world.workspace) == 0, timeout, interval=0.5,
                   what="every turn curated")
    await world.stop()


@contextlib.contextmanager
def disk(root: Path) -> Iterator[tuple[Path | None, str]]:
    """The tmpfs the workspace lives on (for the full-disk scenario), or None and why not."""
    try:
        with small_tmpfs(root / "disk", DISK_SIZE) as mounted:
            yield mounted, ""
    except FaultSetupFailed as exc:
        yield None, str(exc)


async def _play(world: World, name: str, plan: Plan, rng: random.Random, result: Result, count: bool) -> None:
    """Run one scenario on `world`; with `count`, settle, stop and count the invariants after it."""
    world.scenario = name
    began, sent = time.monotonic(), len(world.log.turns)
    try:
        if world.server is None or not world.server.running:
            await world.start()
        result.figures = await SCENARIOS[name].act(world, plan, rng)
        result.missed = result.figures.pop("missed", [])
        if count:
            await settle(world)
    except Exception as exc:  # the scenario failed; its invariants are still counted
        traceback.print_exc(file=sys.stderr)
        result.error = f"{type(exc).__name__}: {exc}"
        count = True
    finally:
        if count:
            with contextlib.suppress(Exception):
                await world.stop()
    result.seconds = round(time.monotonic() - began, 1)
    result.turns = len(world.log.turns) - sent
    if count:
        try:
            result.invariants = check(world.workspace, world.log)
        except Exception as exc:
            result.error = (result.error or "") + f" check: {type(exc).__name__}: {exc}"


async def _elsewhere(root: Path, bridge: MockBridge, n: int, name: str, plan: Plan, rng: random.Random,
                     batch_turns: int) -> Result:
    """A scenario on a fresh workspace of its own (chaos/places.py), counted there."""
    result = Result(name, 0.0, 0)
    began = time.monotonic()
    try:
        with place(SCENARIOS[name].place, root / name, plan.slow_fsync) as found:
            world = World(found.workspace, bridge, Settings(batch_turns=batch_turns, env=found.env), disk=found.disk,
                          first_marker=OWN_MARKERS + n * 10_000)
            try:
                await _play(world, name, plan, rng, result, count=True)
            finally:
                with contextlib.suppress(Exception):
                    await world.stop()
    except FaultSetupFailed as exc:
        result.skipped = str(exc)
        result.seconds = round(time.monotonic() - began, 1)
    return result


async def run(root: Path, plan: Plan, names: list[str], *, batch_turns: int = 3, settle_each: bool = True,
              say: Callable[[str], None] = print) -> list[Result]:
    """Run `names` in order. `settle_each`: settle, stop and count after every scenario (the full
    run); otherwise only after the last one on the shared workspace (the smoke test: one settle
    instead of six). A scenario with a place of its own is always counted there."""
    rng = random.Random(plan.seed)
    results: list[Result] = []
    shared_names = [name for name in names if SCENARIOS[name].place == "shared"]
    with disk(root) as (mounted, why):
        plan = dataclasses.replace(plan, disk=mounted, disk_skip=why)
        async with MockBridge() as bridge:
            world = World((mounted or root) / "workspace", bridge, Settings(batch_turns=batch_turns))
            try:
                for n, name in enumerate(names):
                    if SCENARIOS[name].place != "shared":
                        result = await _elsewhere(root, bridge, n, name, plan, rng, batch_turns)
                        world.attach()
                    else:
                        result = Result(name, 0.0, 0)
                        await _play(world, name, plan, rng, result, settle_each or name == shared_names[-1])
                    results.append(result)
                    say(line(result))
            finally:  # interrupted (Ctrl-C, SIGTERM): no server left running
                with contextlib.suppress(Exception):
                    await world.stop()
    return results
