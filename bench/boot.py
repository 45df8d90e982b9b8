"""Boot assembly: the system prompt from full-size memory files, pending actions and 48 h of learnings."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import summary_ms
from sprite_os.db_worker import Worker
from sprite_os.memory.files import SPECS, MemoryFiles
from sprite_os.memory.loader import BootLoader
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.paths import Layout

RUNS = 300


def _full_files(files: MemoryFiles) -> int:
    total = 0
    for name, spec in SPECS.items():
        text = "".join(f"- {name} line {n}: a realistic sentence of about eighty characters, give or take\n"
                       for n in range(spec.max_lines))
        files.path(name).write_text(text)
        total += len(text)
    return total


async def boot() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(Path(tmp))
        layout.ensure()
        size = _full_files(MemoryFiles(layout))
        memory = Worker("memory", lambda: MemoryDB(layout.memory_db))
        await memory.call(lambda m: m.commit_batch(
            trigger="bench", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
            file_updates={}, base_hashes={},
            learnings=[NewLearning("FACT" if n % 3 else "ACTION", f"learning number {n} about something") for n in
                       range(200)]))
        loader = BootLoader(MemoryFiles(layout), memory)
        samples, prompt = [], ""
        for _ in range(RUNS):
            started = time.perf_counter()
            prompt = await loader.boot_prompt()
            samples.append(time.perf_counter() - started)
        await memory.close()
    return {"files_bytes": size, "prompt_chars": len(prompt), **summary_ms(samples)}


if __name__ == "__main__":
    print(asyncio.run(boot()))
