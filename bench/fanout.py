"""Fan-out: how long a frame takes from publish to each client, with 1 and with 50 clients.

The clients run in their own process (bench/fanout_clients.py), so their decoding is not
counted as the server's work; perf_counter is CLOCK_MONOTONIC, comparable across processes."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile, ratio
from devkit.harness import TOKEN, client_factory, make_settings, running
from devkit.mock_bridge import MockBridge, Text, Turn
from devkit.processes import kit_env
from sprite_os import protocol
from sprite_os.events import EventHub

DELTAS = 300
DELTA_DELAY = 0.01  # a model streaming 100 tokens a second


async def _measure(clients: int, bridge: MockBridge, workspace: Path) -> dict[str, Any]:
    published: dict[int, float] = {}
    original = EventHub.publish

    def timed(hub: EventHub, frame: protocol.ServerFrame) -> None:
        published[hub.seq + 1] = time.perf_counter()  # the seq this frame is about to take
        original(hub, frame)

    # Patched on the class before the server exists: the runtime keeps a bound method.
    EventHub.publish = timed  # type: ignore[method-assign]
    try:
        return await _run(clients, bridge, workspace, published)
    finally:
        EventHub.publish = original  # type: ignore[method-assign]


async def _run(clients: int, bridge: MockBridge, workspace: Path, published: dict[int, float]) -> dict[str, Any]:
    async with running(make_settings(workspace, bridge.url, memory_batch_turns=100_000)) as app:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.fanout_clients", str(app.port), TOKEN, str(clients),
            stdout=asyncio.subprocess.PIPE, env=kit_env(), limit=64 * 1024 * 1024)  # one long JSON line of results
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
        async with client_factory(app.port) as client:
            sender = await client(hello={})
            bridge.agent.script(Turn(Text("word " * DELTAS, chunk_delay=DELTA_DELAY)))
            await sender.send(type="user_message", text="stream something")
            received = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
        await proc.wait()
    ms = [(t - published[seq]) * 1000 for seq, t in received]
    return {"clients": clients, "frames_measured": len(ms), "p50_ms": round(percentile(ms, 50), 3),
            "p95_ms": round(percentile(ms, 95), 3), "p99_ms": round(percentile(ms, 99), 3)}


async def fanout(clients: int = 50, rounds: int = 3) -> dict[str, Any]:
    """Rounds alternate 1 and `clients` clients; the round with the median p95 is reported
    (two cores are shared with the CLI and the client process, so single rounds are noisy)."""
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "many": []}
    async with MockBridge() as bridge:
        with tempfile.TemporaryDirectory() as tmp:
            for n in range(rounds):
                runs["one"].append(await _measure(1, bridge, Path(tmp) / f"one-{n}"))
                runs["many"].append(await _measure(clients, bridge, Path(tmp) / f"many-{n}"))

    def median_round(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return sorted(rs, key=lambda r: r["p95_ms"])[len(rs) // 2]

    one, many = median_round(runs["one"]), median_round(runs["many"])
    return {"one_client": one, f"{clients}_clients": many, "ratio_p50": ratio(many["p50_ms"], one["p50_ms"]),
            "ratio_p95": ratio(many["p95_ms"], one["p95_ms"]),
            "rounds_p95_ms": {"one": [r["p95_ms"] for r in runs["one"]], "many": [r["p95_ms"] for r in runs["many"]]}}
