"""`python -m tests.hostile_stop_server`: tests/stop_server.py's hung stop, and a start whose memory
takes HOSTILE_SLOW_START seconds (a forget's resume at start, as after a kill mid-forget), for
tests/test_stop_hostile_e2e.py."""

from __future__ import annotations

import asyncio
import os

from sprite_os.commands.main import main
from sprite_os.logs import get_logger
from sprite_os.memory.forget.turns import TurnForgetting
from tests import stop_server

log = get_logger(__name__)


def patch() -> None:
    stop_server.patch()
    slow = float(os.environ.get("HOSTILE_SLOW_START", "0"))
    if slow:
        resume = TurnForgetting.resume

        async def slow_resume(self: TurnForgetting) -> int:
            log.warning("hostile_slow_resume", seconds=slow)
            await asyncio.sleep(slow)
            return await resume(self)

        TurnForgetting.resume = slow_resume  # type: ignore[method-assign]


if __name__ == "__main__":
    patch()
    raise SystemExit(main(["serve"]))
