"""`python -m tests.stop_server`: `sprite-os serve` as a Sprite runs it, with every step of a stop
made to hang (test_stop_deadline_e2e.py) and a stop timeout of STOP_TEST_TIMEOUT seconds:

- a file listing that never ends (a console request in flight);
- a CLI that ignores its interrupt, so the turn the model streams for minutes never ends;
- a forget's decision stuck on a thread that never returns (the interpreter's exit waits for it).
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from sprite_os import server
from sprite_os.agent.process import AgentProcess
from sprite_os.commands.main import main
from sprite_os.console.files_api import FilesConsole
from sprite_os.memory import system
from sprite_os.memory.forget.turns import TurnForgetting

NEVER = threading.Event()  # never set


async def _never_ends(*_: Any, **__: Any) -> Any:
    await asyncio.Event().wait()


async def _ignored(self: AgentProcess) -> None:
    return None


async def _stuck_on_a_thread(*_: Any, **__: Any) -> None:
    await asyncio.to_thread(NEVER.wait)


def patch() -> None:
    server.STOP_TIMEOUT = float(os.environ["STOP_TEST_TIMEOUT"])  # type: ignore[misc]
    FilesConsole._list = _never_ends  # type: ignore[method-assign]
    AgentProcess.interrupt = _ignored  # type: ignore[method-assign]
    TurnForgetting._decide = _stuck_on_a_thread  # type: ignore[method-assign,assignment]
    system.BOOT_DECIDE_BUDGET = 0.5  # type: ignore[misc]  # the next session's boot waits this long for it


if __name__ == "__main__":
    patch()
    raise SystemExit(main(["serve"]))
