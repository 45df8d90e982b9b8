"""Where a turn's time goes, per server, in the memory on / off benchmark (bench/turns.py: hooks).

    PYTHONPATH=. python -m bench.spans [ROUNDS [ROUNDS_WITH_A_PAST]]

Runs the hooks benchmark's zero-latency lines (the first session; with a past, if asked) with timers wrapped around the runtime's steps (the
servers run in this process), and prints, per server, the median of each span over the measured
turns, and the memory-on server's against the first memory-off one's, turn by turn paired:

- queued: the gateway handed the message to the runtime -> its task began the turn;
- start: -> the turn's record opened (memory's `turn_started`) and the prompt about to be sent;
- recall: the context sent before the message (auto-recall, when memory is on);
- send: the prompt written to the CLI;
- cli: -> the CLI's result message, minus the runtime's own work on each message before it;
- loop: the runtime's work on each message it streamed (capture's `observe`, the frames);
- tail: the result message -> the SDK's stream ended;
- close: the stream ended -> the result's frames made and the turn's record closed;
- durable: the wait until the closed turn is on disk (memory on: the synced commit);
- publish: the turn's last frames (turn_complete) published;
- total: the gateway's hand-over -> turn_complete published;
- deliver: turn_complete published -> the client has it (what runs on the loop meanwhile: memory's
  work after the turn, the gateway's send).

Then the CPU of each thread in the turn's window, and counts per turn: the CLI's requests to the
server (ctl:), the event loop's wake-ups from other threads by what they call back (wake:thread:callback; the
servers share one loop, so a wake-up is counted in the turn in flight, whichever server it is for),
and the turn journal's saves (journal:save, journal:synced).

A tool for finding where a cost lies, not a benchmark: its wrappers cost a few microseconds a
span, alike on every server.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from claude_agent_sdk._internal import query as sdk_query

from bench import turns
from sprite_os import runtime as rt
from sprite_os.agent import process
from sprite_os.memory.capture import journal, writer
from sprite_os.memory.recall import service

SPANS = ("queued", "start", "recall", "send", "cli", "loop", "tail", "close", "durable", "publish", "total",
         "deliver")
# memory on alone: the hops to the recall thread and transcript.db's, and the work there
HOPS = ("recall:to_thread", "recall:on_thread", "recall:back", "commit:to_thread", "commit:on_thread",
        "commit:back")
COUNTED = ("ctl", "wake", "journal")
_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("span_turn", default=None)


class Recorder:
    """Each runtime's turns, as marks (perf_counter seconds) in order."""

    def __init__(self) -> None:
        self.turns: dict[str, list[dict[str, float]]] = {}
        self._open: dict[int, dict[str, Any]] = {}
        self.recalling: dict[str, Any] | None = None  # the turn whose auto-recall runs
        self._lines: dict[Any, str] = {}
        self.active: dict[str, Any] | None = None  # the turn running now (turns run one at a time)
        self.window: dict[str, Any] | None = None  # the turn from its submission to its end (one at a time)
        self.last: tuple[dict[str, float], float] | None = None  # the last turn's spans, and when it was published

    def label(self, runtime: rt.AgentRuntime) -> str:
        """"on", "off", "off_again" ("<block>-on"), in the benchmark's first line, and with "+past"
        in its line whose memory-on workspace holds a past session (its own scratch folder)."""
        workspace = runtime._settings.workspace
        line = self._lines.setdefault(workspace.parent, "" if not self._lines else "+past")
        return workspace.name.split("-", 1)[1] + line

    def submitted(self, runtime: rt.AgentRuntime) -> None:
        self.last = None
        self._open[id(runtime)] = self.window = {"label": self.label(runtime), "submit": time.perf_counter(),
                                                 "loop": 0.0, "cpu": cpu_by_thread()}

    def count(self, kind: str) -> None:
        """One more `kind` in the turn in flight (from any thread: a lost increment is a count off by one)."""
        if (t := self.window) is not None:
            counts = t.setdefault("counts", {})
            counts[kind] = counts.get(kind, 0) + 1

    def turn(self, runtime: rt.AgentRuntime) -> dict[str, Any]:
        return self._open.setdefault(id(runtime), {"label": self.label(runtime), "loop": 0.0})

    def done(self, runtime: rt.AgentRuntime) -> None:
        t = self._open.pop(id(runtime), None)
        if t is self.window:
            self.window = None
        if t is not None and "published" in t and "submit" in t:
            before, after = t.pop("cpu"), cpu_by_thread()
            spans = _spans(t)
            for group in set(before) | set(after):
                spans[f"cpu:{group}"] = (after.get(group, 0.0) - before.get(group, 0.0)) * 1000
            self.turns.setdefault(t["label"], []).append(spans)
            self.last = spans, t["published"]

    def delivered(self) -> None:
        """The client has the last turn's turn_complete."""
        if self.last is not None:
            spans, published = self.last
            spans["deliver"] = (time.perf_counter() - published) * 1000
            self.last = None


_DIGITS = re.compile(r"[_-]?\d+$")


def cpu_by_thread() -> dict[str, float]:
    """CPU seconds so far of this process's threads, by name (less its number: "db-recall-embed"), and
    of its children (the CLIs) as one."""
    out: dict[str, float] = {}
    named = {t.native_id: t.name for t in threading.enumerate()}  # Python's names; the kernel's for the rest
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError):
            name = named.get(int(task)) or open(f"/proc/self/task/{task}/comm").read().strip()
            name = _DIGITS.sub("", name)
            ran = int(open(f"/proc/self/task/{task}/schedstat").read().split()[0]) / 1e9
            out[name] = out.get(name, 0.0) + ran
    out["CLIs"] = turns.tree_cpu_s() - time.process_time()
    return out


def _spans(t: dict[str, Any]) -> dict[str, float]:
    ms = {k: v * 1000 for k, v in t.items() if isinstance(v, float)}
    return {**t.get("counts", {}), "queued": ms["run"] - ms["submit"], "start": ms["recall_start"] - ms["run"],
            "recall": ms["recall_end"] - ms["recall_start"], "send": ms["sent"] - ms["recall_end"],
            "cli": ms["result"] - ms["sent"] - ms["loop"], "loop": ms["loop"], "tail": ms["stream_end"] - ms["result"],
            "close": ms["saving"] - ms["stream_end"], "durable": ms["saved"] - ms["saving"],
            "publish": ms["published"] - ms["saved"], "total": ms["published"] - ms["submit"],
            **_hops(ms)}


def _hops(ms: dict[str, float]) -> dict[str, float]:
    out = {}
    if "recall_thread_start" in ms:
        out |= {"recall:to_thread": ms["recall_thread_start"] - ms["recall_start"],
                "recall:on_thread": ms["recall_thread_end"] - ms["recall_thread_start"],
                "recall:back": ms["recall_end"] - ms["recall_thread_end"]}
    if "commit_thread_end" in ms:
        out |= {"commit:to_thread": ms["commit_thread_start"] - ms["commit_submit"],
                "commit:on_thread": ms["commit_thread_end"] - ms["commit_thread_start"],
                "commit:back": ms["saved"] - max(ms["commit_thread_end"], ms["saving"])}
    return out


def _mark(name: str) -> None:
    if (t := _current.get()) is not None:
        t[name] = time.perf_counter()


@contextlib.contextmanager
def instrumented(rec: Recorder) -> Iterator[None]:
    """The runtime's and the CLI process's steps wrapped with marks, for as long as this lasts."""
    R, P = rt.AgentRuntime, process.AgentProcess
    saved = {name: getattr(R, name) for name in ("submit", "_run_turn", "_recalled", "_saved", "_publish_result")}
    saved_p = {name: getattr(P, name) for name in ("send", "replies")}

    def submit(self: rt.AgentRuntime, text: str, client_id: str | None = None) -> None:
        rec.submitted(self)
        saved["submit"](self, text, client_id)

    async def run_turn(self: rt.AgentRuntime, turn: Any) -> None:
        t = rec.turn(self)
        t["run"] = time.perf_counter()
        token = _current.set(t)
        rec.active = t
        try:
            await saved["_run_turn"](self, turn)
        finally:
            _current.reset(token)
            rec.active = None
            rec.done(self)

    control = sdk_query.Query._handle_control_request

    async def counted_control(self: Any, request: Any) -> None:
        """The CLI's requests to the server in a turn (hooks, MCP calls), counted by kind."""
        if rec.active is not None:
            data = request["request"]
            rec.count("ctl:" + data["subtype"] + (":" + str(data["message"].get("method")) if "message" in data else ""))
        await control(self, request)

    async def recalled(self: rt.AgentRuntime, turn: Any) -> str | None:
        _mark("recall_start")
        rec.recalling = _current.get()
        try:
            return await saved["_recalled"](self, turn)  # type: ignore[no-any-return]
        finally:
            _mark("recall_end")

    async def saved_(self: rt.AgentRuntime, turn: Any, record: Any) -> bool:
        _mark("saving")
        try:
            return await saved["_saved"](self, turn, record)  # type: ignore[no-any-return]
        finally:
            _mark("saved")

    def publish_result(self: rt.AgentRuntime, *args: Any) -> None:
        saved["_publish_result"](self, *args)
        _mark("published")

    async def send(self: process.AgentProcess, prompt: str, context: str | None = None) -> None:
        await saved_p["send"](self, prompt, context)
        _mark("sent")

    def replies(self: process.AgentProcess) -> AsyncIterator[Any]:
        inner = saved_p["replies"](self)

        async def timed() -> AsyncIterator[Any]:
            t = _current.get()
            async for message in inner:
                if t is not None and type(message).__name__ == "ResultMessage":
                    t["result"] = time.perf_counter()
                handed = time.perf_counter()
                yield message
                if t is not None and "result" not in t:
                    t["loop"] += time.perf_counter() - handed
            _mark("stream_end")

        return timed()

    apply, auto_recalled = writer._apply, service.auto_recalled

    def timed_apply(writes: Any) -> Any:
        run, t = apply(writes), _current.get()
        if t is None:
            return run
        t["commit_submit"] = time.perf_counter()

        def timed(db: Any) -> None:
            t["commit_thread_start"] = time.perf_counter()
            try:
                run(db)
            finally:
                t["commit_thread_end"] = time.perf_counter()

        return timed

    def timed_recall(*args: Any, **kw: Any) -> Any:
        t = rec.recalling
        if t is not None:
            t["recall_thread_start"] = time.perf_counter()
        try:
            return auto_recalled(*args, **kw)
        finally:
            if t is not None:
                t["recall_thread_end"] = time.perf_counter()

    save = journal.JournalFile.save

    def counted_save(self: journal.JournalFile, data: bytes | None, sync: bool = True) -> None:
        rec.count("journal:save")
        if sync and data is not None:
            rec.count("journal:synced")
        save(self, data, sync)

    server_turn = turns.server_turn

    async def delivered_turn(*args: Any, **kw: Any) -> float:
        took = await server_turn(*args, **kw)
        rec.delivered()
        return took

    loop = asyncio.get_running_loop()
    threadsafe = loop.call_soon_threadsafe

    def counted_wake(callback: Any, *args: Any, context: Any = None) -> Any:
        if threading.current_thread() is not threading.main_thread():  # by the thread, and what it calls
            fn = callback.func if hasattr(callback, "func") else callback
            what = getattr(fn, "__qualname__", type(fn).__name__).rsplit(".", 1)[-1]
            rec.count(f"wake:{_DIGITS.sub('', threading.current_thread().name)}:{what}"[:40])
        return threadsafe(callback, *args, context=context)

    writer._apply, service.auto_recalled = timed_apply, timed_recall
    sdk_query.Query._handle_control_request = counted_control  # type: ignore[method-assign]
    journal.JournalFile.save = counted_save  # type: ignore[method-assign]
    setattr(loop, "call_soon_threadsafe", counted_wake)  # noqa: B010 (an instance's own, taken off below)
    turns.server_turn = delivered_turn

    news = {"submit": submit, "_run_turn": run_turn, "_recalled": recalled, "_saved": saved_,
            "_publish_result": publish_result}
    try:
        for name, fn in news.items():
            setattr(R, name, fn)
        P.send, P.replies = send, replies  # type: ignore[method-assign]
        yield
    finally:
        for name, fn in saved.items():
            setattr(R, name, fn)
        for name, fn in saved_p.items():
            setattr(P, name, fn)
        writer._apply, service.auto_recalled = apply, auto_recalled
        sdk_query.Query._handle_control_request = control  # type: ignore[method-assign]
        journal.JournalFile.save = save  # type: ignore[method-assign]
        del loop.call_soon_threadsafe
        turns.server_turn = server_turn


def table(rec: Recorder, line: str = "") -> str:
    """Medians per span and server, and on - off paired turn by turn (the same round's turns)."""
    labels = [name + line for name in ("on", "off", "off_again") if name + line in rec.turns]
    lines = [f"{'span (ms, median)':<20}" + "".join(f"{name:>11}" for name in labels) + f"{'on-off':>11}"]
    on, off = rec.turns.get("on" + line, []), rec.turns.get("off" + line, [])
    n = min(len(on), len(off))
    for span in SPANS + HOPS:
        row = f"{span:<20}"
        for name in labels:
            got = [t[span] for t in rec.turns[name] if span in t]
            row += f"{statistics.median(got):>11.3f}" if got else f"{'':>11}"
        if span in HOPS:
            lines.append(row)
            continue
        if n and (pairs := [on[i][span] - off[i][span] for i in range(n) if span in on[i] and span in off[i]]):
            row += f"{statistics.median(pairs):>11.3f}"
        lines.append(row)
    groups = sorted({k for name in labels for t in rec.turns[name] for k in t if k.startswith("cpu:")})
    for group in groups:  # CPU in the turn's window, by thread: the median of each server's turns
        row = f"{group[:20]:<20}" + "".join(
            f"{statistics.median(t.get(group, 0.0) for t in rec.turns[name]):>11.3f}" for name in labels)
        if n:
            row += f"{statistics.median(on[i].get(group, 0.0) - off[i].get(group, 0.0) for i in range(n)):>11.3f}"
        lines.append(row)
    kinds = sorted({k for name in labels for t in rec.turns[name] for k in t if k.split(":")[0] in COUNTED})
    for kind in kinds:  # per turn, on average: the CLI's requests, the loop's wake-ups, the journal's saves
        lines.append(f"{kind[:40]:<40}" + "".join(
            f"{sum(t.get(kind, 0) for t in rec.turns[name]) / len(rec.turns[name]):>11.2f}" for name in labels))
    lines.append(f"turns: {', '.join(f'{name} {len(rec.turns[name])}' for name in labels)}")
    return "\n".join(lines)


async def main(rounds: int, past_rounds: int) -> None:
    rec = Recorder()
    with instrumented(rec):
        result = await turns.hooks(rounds, model_latency=None, past_rounds=past_rounds)
    for key, line in (("zero_latency", ""), ("zero_latency_with_past", "+past")):
        if (z := result.get(key)) is None:
            continue
        print(f"{key}:\n{table(rec, line)}")
        print(f"client side: on/off {z['ratio_median']:.3f} {z['ratio_ci95']} (+{z['added_median_ms']:.2f} ms); "
              f"A/A {z['aa']['ratio']:.3f} {z['aa']['ratio_ci95']}\n")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(args[0] if args else 90, args[1] if len(args) > 1 else 0))
