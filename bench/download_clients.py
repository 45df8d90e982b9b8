"""The download benchmark's clients, in their own process so their work doesn't count as the server's.

    python -m bench.download_clients PORT TOKEN N PATH

N connections download PATH at once over the socket, a chunk at a time, hashing as they go (they
keep nothing), and send a chunk the server dropped for rate again, as the console's page does.
Prints one JSON line: each download's sha256, the seconds they took, and how many chunks were sent
again.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect


async def _ask(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(frame))
    while True:
        answer: dict[str, Any] = json.loads(await ws.recv())
        if answer.get("request_id") == frame["request_id"]:
            return answer


async def _download(port: int, token: str, path: str) -> tuple[str, int]:
    retries = 0
    async with connect(f"ws://127.0.0.1:{port}", additional_headers={"Authorization": f"Bearer {token}"},
                       max_size=4 * 1024 * 1024) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        await ws.recv()  # ready
        opened = await _ask(ws, {"type": "download_start", "request_id": "s", "path": path})
        assert opened["type"] == "download_start_result", opened
        digest, offset, n = hashlib.sha256(), 0, 0
        while True:
            n += 1
            answer = await _ask(ws, {"type": "download_chunk", "request_id": f"c{n}",
                                     "download_id": opened["download_id"], "offset": offset})
            if answer.get("code") == "rate_limited":
                retries += 1
                await asyncio.sleep(0.05)
                continue
            assert answer["type"] == "download_chunk_result", answer
            data = base64.b64decode(answer["data"])
            digest.update(data)
            offset += len(data)
            if answer["eof"]:
                return digest.hexdigest(), retries


async def main(port: int, token: str, n: int, path: str) -> None:
    began = time.perf_counter()
    done = await asyncio.gather(*(_download(port, token, path) for _ in range(n)))
    print(json.dumps({"sha256": [d for d, _ in done], "seconds": round(time.perf_counter() - began, 2),
                      "retries": sum(r for _, r in done)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]))
