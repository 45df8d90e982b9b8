"""How long a person's forget of a turn takes to decide which memory-file lines came from it, with the
dense retriever on: a memory system whose user.md has `versions` versions of 20 lines each (every
line distinct, `versions * 20` lines in all, one in ten saying the forgotten turn's words), and 40
kept turns. Two forgets one after the other (the second finds the line vectors kept from the
first). CPU time is the process's (every thread: the embedder's, the searcher's), the figure to
compare on a shared machine; wall time beside it.

    python -m bench --only forget_speed [--quick]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.harness import make_settings, wait_for
from sprite_os.memory.forget.jobs import jobs
from sprite_os.memory.memory_store import NewLearning
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB

T0 = 1_800_000_000.0
LINES_A_VERSION = 20
THINGS = ("bread", "coffee", "stamps", "paint", "rice", "lamps", "shoes", "tiles", "soap", "maps")
PLACES = ("market", "harbour", "station", "library", "garden", "bakery", "museum", "office")


def _line(i: int) -> str:
    if i % 10 == 0:  # the words of the turns forgotten: found by the words, then checked
        return f"- Lives in Lisbon, Alfama ({i})" if i % 20 == 0 else f"- Rides the Porto tram daily ({i})"
    return f"- Bought {THINGS[i % len(THINGS)]} at the {PLACES[(i // 10) % len(PLACES)]} on visit {i}"


def _turn(n: int, user: str) -> NewObservation:
    return NewObservation(timestamp=T0 + n, session_id="s1", sequence_num=n, user_message=user,
                          tool_calls_json="[]", agent_response="Noted.", turn_id=f"t{n}", status="completed")


async def _forget_speed(versions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="forget-speed-") as tmp:
        settings = make_settings(Path(tmp) / "ws", "http://127.0.0.1:9")
        settings.layout.ensure()
        system = MemorySystem(settings)
        await system.start()
        try:
            system.daemon.before_batches = _nothing  # the files' pass is not what is measured

            def write(t: TranscriptDB) -> list[int]:
                t.start_session("s1", T0)
                said = ["I live in Lisbon, in Alfama.", "I ride the Porto tram every day."]
                said += [f"I went to the {PLACES[n % len(PLACES)]} for {THINGS[n % len(THINGS)]} today."
                         for n in range(40)]
                return [t.append(_turn(n + 1, text)) or 0 for n, text in enumerate(said)]

            ids = await system.transcript.call(write)
            lines = [_line(i) for i in range(versions * LINES_A_VERSION)]
            for v in range(versions):
                text = "# User\n" + "\n".join(lines[v * LINES_A_VERSION:(v + 1) * LINES_A_VERSION]) + "\n"
                system.files.write("user.md", text, f"batch-{v}")
            await system.memory.call(lambda m: m.commit_batch(
                trigger="t", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                learnings=[NewLearning("FACT", "The user lives in Alfama, Lisbon", "s1", ids[0])],
                file_updates={"user.md": system.files.read("user.md")}, base_hashes={}))
            system.recall.indexer.nudge()
            await wait_for(lambda: system.recall.indexer.health.embedded >= len(ids), timeout=600, what="the vectors")
            await system.recall.settle(120)
            out: dict[str, Any] = {"lines": len(lines), "versions": versions}
            for name, turn in (("first", ids[0]), ("second", ids[1])):
                cpu, wall = time.process_time(), time.perf_counter()
                await system.forget_turns([turn], by="bench")
                answered = time.perf_counter() - wall  # the person's wait: the words out, the job on disk
                await system.forgetting.decided(600)
                out[name] = {"cpu_s": round(time.process_time() - cpu, 2), "answered_s": round(answered, 2),
                             "wall_s": round(time.perf_counter() - wall, 2),
                             "lines_found": len((await system.memory.call(jobs))[-1].line_hashes)}
            return out
        finally:
            await system.stop()


async def _nothing() -> None:
    pass


async def forget_speed(quick: bool) -> dict[str, Any]:
    return await _forget_speed(10 if quick else 50)


if __name__ == "__main__":
    import json

    print(json.dumps(asyncio.run(forget_speed(False)), indent=1))
