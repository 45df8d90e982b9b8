"""The fan-out benchmark's clients, in their own process so their work doesn't count as the server's.

    python -m bench.fanout_clients PORT TOKEN N

Prints "ready" once all N clients have said hello, then, when the turn completes,
one JSON line: [[seq, perf_counter_at_receipt], ...] for every text_delta at every client.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from websockets.asyncio.client import connect


async def main(port: int, token: str, n: int) -> None:
    received: list[tuple[int, float]] = []
    sockets = [await connect(f"ws://127.0.0.1:{port}", additional_headers={"Authorization": f"Bearer {token}"})
               for _ in range(n)]

    async def listen(ws) -> None:  # type: ignore[no-untyped-def]
        async for raw in ws:
            now = time.perf_counter()
            frame = json.loads(raw)
            if frame["type"] == "text_delta":
                received.append((frame["seq"], now))
            elif frame["type"] == "turn_complete":
                return

    for ws in sockets:
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())  # ready
    print("ready", flush=True)
    await asyncio.gather(*(listen(ws) for ws in sockets))
    print(json.dumps(received), flush=True)
    for ws in sockets:
        await ws.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
