"""Fan-out: how long a frame takes from publish to each client, with 1 and with 50 clients."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

from bench.stats import percentile, ratio
from sprite_os import protocol
from tests.conftest import TOKEN, make_settings, running
from tests.mock_bridge import MockBridge, Text, Turn

DELTAS = 300


async def _measure(clients: int, bridge: MockBridge, workspace: Path) -> dict[str, Any]:
    async with running(make_settings(workspace, bridge.url, memory_batch_turns=100_000)) as app:
        published: dict[int, float] = {}
        original = app.hub.publish

        def timed(frame: protocol.ServerFrame) -> None:
            original(frame)
            published[app.hub.seq] = time.perf_counter()

        app.hub.publish = timed  # type: ignore[method-assign]
        sockets = [await connect(f"ws://127.0.0.1:{app.port}", additional_headers={"Authorization": f"Bearer {TOKEN}"})
                   for _ in range(clients)]
        latencies: list[float] = []

        async def listen(ws: Any) -> None:
            await ws.send(json.dumps({"type": "hello"}))
            async for raw in ws:
                now = time.perf_counter()
                frame = json.loads(raw)
                if frame["type"] == "text_delta":
                    latencies.append(now - published[frame["seq"]])
                if frame["type"] == "turn_complete":
                    return

        listeners = [asyncio.create_task(listen(ws)) for ws in sockets]
        await asyncio.sleep(0.5)  # every client has said hello
        bridge.agent.script(Turn(Text("word " * DELTAS)))
        await sockets[0].send(json.dumps({"type": "user_message", "text": "stream something"}))
        await asyncio.wait_for(asyncio.gather(*listeners), 120)
        for ws in sockets:
            await ws.close()
    ms = [x * 1000 for x in latencies]
    return {"clients": clients, "frames_measured": len(ms), "p50_ms": round(percentile(ms, 50), 3),
            "p95_ms": round(percentile(ms, 95), 3), "p99_ms": round(percentile(ms, 99), 3)}


async def fanout(clients: int = 50) -> dict[str, Any]:
    async with MockBridge() as bridge:
        with tempfile.TemporaryDirectory() as tmp:
            one = await _measure(1, bridge, Path(tmp) / "one")
            many = await _measure(clients, bridge, Path(tmp) / "many")
    return {"one_client": one, f"{clients}_clients": many, "ratio_p50": ratio(many["p50_ms"], one["p50_ms"]),
            "ratio_p95": ratio(many["p95_ms"], one["p95_ms"])}
