"""Run the mock Bridge standalone (the demo model and the demo curator):
`python -m devkit.mock_bridge --port 8766`."""

from __future__ import annotations

import argparse
import asyncio
import signal

from .demo import DEV_WORD_DELAY
from .server import MockBridge


async def _serve(host: str, port: int) -> None:
    bridge = MockBridge(host, port, demo_curator=True, demo_word_delay=DEV_WORD_DELAY)
    await bridge.start()
    print(f"mock bridge listening on {bridge.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await bridge.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.mock_bridge", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
