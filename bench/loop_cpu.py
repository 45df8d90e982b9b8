"""The event loop's CPU per turn, memory on against off, function by function (bench/turns.py: hooks).

    PYTHONPATH=. python -m bench.loop_cpu [ROUNDS [TOP [DUMP]]]    (ROUNDS 60 and TOP 40 unless given)

Runs the hooks benchmark's zero-latency line (three servers in this process, one event loop: memory
on, off and off again) and charges the loop thread's work to the server whose turn was submitted
last, until the next submission: what a turn leaves running on the loop counts with the next turn,
whichever server's, as in the hooks bench (the indexer's steps after a memory-on turn land on an
off server's). The warm-up turns, and each block's stop and the next one's start, are no one's. Prints:

- the loop thread's CPU per turn (its own clock, read at each switch), per server, mean and median,
  and on - off and off again - off (the A/A pair); with its user and system clock ticks and its
  voluntary (a wake-up: epoll, the GIL handed back) and involuntary context switches;
- then, unless TOP is 0, the same rounds again under cProfile on the loop thread's CPU clock: per
  function, its calls and own time per turn on each server, the TOP functions by on - off own time,
  and the TOP by calls added. DUMP: each server's profile to DUMP-<server>.prof, for pstats.

A tool for finding a cost, not a benchmark: cProfile slows every Python call several times (small
ones most), alike on every server, so read its times as shares, and the unprofiled pass for the
loop's real CPU. Call counts hold whatever the load; the times do not, and the A/A pair shows by how much.
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import turns
from devkit.host import own_home
from sprite_os import runtime as rt

LABELS = ("on", "off", "off_again")


class Charger:
    """The loop's CPU (and, when profiling, a profile) charged to the server whose turn was submitted last."""

    def __init__(self, profile: bool) -> None:
        self.cpu: dict[str, list[float]] = {name: [] for name in LABELS}  # seconds, a turn each
        self.turns = {name: 0 for name in LABELS}
        # The loop thread's CPU clock, not the wall's: time the loop spends waiting in epoll is no one's.
        self.profiles = ({name: cProfile.Profile(time.thread_time_ns, 1e-9) for name in LABELS}  # type: ignore[call-arg]
                         if profile else {})
        # per server: the loop thread's (user, system) clock ticks and its (voluntary, involuntary) switches
        self.counts: dict[str, list[int]] = {name: [0, 0, 0, 0] for name in LABELS}
        self._current: str | None = None
        self._since = 0.0
        self._counted = [0, 0, 0, 0]

    def switch(self, label: str | None) -> None:
        now = time.thread_time()  # the loop thread's: submit runs on it
        counted = _thread_counts()
        if self._current is not None:
            self.cpu[self._current].append(now - self._since)
            self.counts[self._current] = [a + b - c for a, b, c in
                                          zip(self.counts[self._current], counted, self._counted, strict=True)]
            if self.profiles:
                self.profiles[self._current].disable()
        self._current, self._since, self._counted = label, now, counted
        if label is not None:
            self.turns[label] += 1
            if self.profiles:
                self.profiles[label].enable()


def _thread_counts() -> list[int]:
    """This thread's user and system CPU (clock ticks) and its voluntary and involuntary context switches:
    a wake-up of the loop (epoll, the GIL handed back) is a voluntary one."""
    stat = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
    status = dict(line.split(":", 1) for line in Path("/proc/thread-self/status").read_text().splitlines()
                  if ":" in line)
    return [int(stat[11]), int(stat[12]), int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"])]


@contextlib.contextmanager
def charged(charger: Charger) -> Iterator[None]:
    submit = rt.AgentRuntime.submit
    seen: dict[str, int] = {}  # turns submitted, per runtime: each block of servers warms up anew

    def charging(self: rt.AgentRuntime, text: str, client_id: str | None = None) -> None:
        name = self._settings.workspace.name.split("-", 1)[1]  # "<block>-on", "<block>-off", ...
        key = str(self._settings.workspace)
        seen[key] = n = seen.get(key, 0) + 1
        charger.switch(name if name in LABELS and n > turns.WARMUP else None)  # the warm-up's turns: no one's
        submit(self, text, client_id)

    interleave = turns.interleave

    async def block(*args: Any, **kw: Any) -> dict[str, list[float]]:
        try:
            return await interleave(*args, **kw)
        finally:  # the block's last turn ends here: the servers' stop and the next block's start are no one's
            charger.switch(None)

    rt.AgentRuntime.submit = charging  # type: ignore[method-assign]
    turns.interleave = block
    try:
        yield
    finally:
        charger.switch(None)
        rt.AgentRuntime.submit = submit  # type: ignore[method-assign]
        turns.interleave = interleave


async def measured(rounds: int, profile: bool) -> Charger:
    charger = Charger(profile)
    with charged(charger):
        await turns.hooks(rounds, model_latency=None, past_rounds=0)
    return charger


def _per_function(charger: Charger) -> dict[str, dict[tuple[str, int, str], tuple[float, float]]]:
    """label -> function -> (calls a turn, own seconds a turn)."""
    out = {}
    for name, profile in charger.profiles.items():
        n = max(1, charger.turns[name])
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        out[name] = {fn: (row[1] / n, row[2] / n) for fn, row in stats.items()}
    return out


def _where(fn: tuple[str, int, str]) -> str:
    path, line, name = fn
    for cut in ("/os_src/", "/sprite_os/", "/site-packages/", "/lib/python3"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{path}:{line}({name})" if line else name


def report(plain: Charger, profiled: Charger | None, top: int) -> str:
    lines = ["loop thread CPU per turn (ms)" + "".join(f"{n:>11}" for n in LABELS) + f"{'on-off':>9}{'aa':>8}"]
    for title, c in (("unprofiled", plain), ("profiled", profiled)):
        if c is None:
            continue
        for stat, fn in (("mean", statistics.fmean), ("median", statistics.median)):
            per = {n: 1000 * fn(c.cpu[n]) if c.cpu[n] else 0.0 for n in LABELS}
            lines.append(f"  {title + ', ' + stat:<27}" + "".join(f"{per[n]:>11.3f}" for n in LABELS)
                         + f"{per['on'] - per['off']:>9.3f}{per['off_again'] - per['off']:>8.3f}")
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    for i, title in enumerate(("user ms (ticks)", "system ms (ticks)", "voluntary switches", "involuntary switches")):
        per = {n: plain.counts[n][i] * (tick if i < 2 else 1) / max(1, plain.turns[n]) for n in LABELS}
        lines.append(f"  unprofiled, {title:<15}" + "".join(f"{per[n]:>11.3f}" for n in LABELS)
                     + f"{per['on'] - per['off']:>9.3f}{per['off_again'] - per['off']:>8.3f}")
    lines.append(f"  turns: {', '.join(f'{n} {plain.turns[n]}' for n in LABELS)} (warm-up left out)")
    if profiled is None:
        return "\n".join(lines)
    fns = _per_function(profiled)
    keys = set().union(*(fns[n] for n in LABELS))
    zero = (0.0, 0.0)
    rows = sorted(keys, key=lambda k: fns["on"].get(k, zero)[1] - fns["off"].get(k, zero)[1], reverse=True)
    lines.append(f"\n{'calls/turn on':>13}{'off':>8}{'own µs/turn on':>16}{'off':>9}{'aa':>8}{'on-off':>9}  function")
    for k in rows[:top]:
        on, off, aa = (fns[n].get(k, zero) for n in LABELS)
        lines.append(f"{on[0]:>13.1f}{off[0]:>8.1f}{on[1] * 1e6:>16.1f}{off[1] * 1e6:>9.1f}"
                     f"{(aa[1] - off[1]) * 1e6:>8.1f}{(on[1] - off[1]) * 1e6:>9.1f}  {_where(k)}")
    more = sorted(keys, key=lambda k: fns["on"].get(k, zero)[0] - fns["off"].get(k, zero)[0], reverse=True)
    lines.append("\nmost calls added a turn by memory (on - off):")
    for k in more[:top]:
        on, off = fns["on"].get(k, zero), fns["off"].get(k, zero)
        lines.append(f"{on[0] - off[0]:>13.1f}  {_where(k)}")
    return "\n".join(lines)


async def main(rounds: int, top: int, dump: str | None) -> None:
    plain = await measured(rounds, profile=False)
    profiled = await measured(rounds, profile=True) if top else None
    print(report(plain, profiled, top))
    if dump and profiled is not None:  # each server's profile, for pstats: DUMP-on.prof, DUMP-off.prof, DUMP-off_again.prof
        for name, profile in profiled.profiles.items():
            profile.dump_stats(f"{dump}-{name}.prof")


if __name__ == "__main__":
    args = sys.argv[1:]
    with own_home("sprite-bench-home-"):  # as `python -m bench`: the CLIs leave nothing in the host's HOME
        asyncio.run(main(int(args[0]) if args else 60, int(args[1]) if len(args) > 1 else 40,
                         args[2] if len(args) > 2 else None))
