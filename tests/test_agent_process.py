"""AgentProcess.interrupt against a CLI that exits instead of answering (a Ctrl-C in `make run`'s
terminal reaches the CLI too: tests/test_server_e2e.py stops a real server that way), and against one
that lives on and never answers."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from sprite_os.agent import process as agent_process
from sprite_os.agent.process import AgentProcess


class SilentCLI:
    """The SDK client's surface that `interrupt` uses: a CLI that never answers an interrupt, or whose
    write fails (`refuse`), and a process that exits when told."""

    def __init__(self, refuse: bool = False) -> None:
        self._transport = SimpleNamespace(_process=SimpleNamespace(pid=4242, returncode=None))
        self.refuse = refuse

    def exit(self, code: int = 0) -> None:
        self._transport._process.returncode = code

    async def interrupt(self) -> None:
        if self.refuse:
            raise ConnectionError("Cannot write to terminated process")
        await asyncio.Event().wait()


def agent(cli: SilentCLI) -> AgentProcess:
    return AgentProcess(SimpleNamespace(cwd=None), factory=lambda _: cli)  # type: ignore[arg-type,return-value]


async def interrupted_while(cli: SilentCLI, meanwhile: Any) -> tuple[float, list[str]]:
    """Interrupt, doing `meanwhile` to the CLI 0.1 s in: how long the interrupt took, and what it logged."""
    proc = agent(cli)
    with capture_logs() as logs:
        asked = time.monotonic()
        asking = asyncio.create_task(proc.interrupt())
        await asyncio.sleep(0.1)
        meanwhile()
        await asking
        took = time.monotonic() - asked
    return took, [entry["event"] for entry in logs]


@pytest.mark.parametrize("refuse", [False, True], ids=["unanswered", "write_failed"])
async def test_a_cli_that_exits_during_its_interrupt_is_no_failure_and_not_waited_on(
        monkeypatch: pytest.MonkeyPatch, refuse: bool) -> None:
    # Both waits long, the exit 0.1 s in: not waited on is well under them however late a loaded machine
    # wakes the loop (an exit seen 1.2 s late outlasted a 1 s grace, and a bound of 1 s).
    monkeypatch.setattr(agent_process, "INTERRUPT_TIMEOUT", 30.0)
    monkeypatch.setattr(agent_process, "EXIT_GRACE", 30.0)
    cli = SilentCLI(refuse)
    took, events = await interrupted_while(cli, cli.exit)
    assert took < 20 and events == ["cli_exited_during_interrupt"], (took, events)


async def test_a_live_cli_that_never_answers_its_interrupt_is_a_failure_within_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_process, "INTERRUPT_TIMEOUT", 0.3)
    took, events = await interrupted_while(SilentCLI(), lambda: None)
    assert 0.3 <= took < 15 and events == ["interrupt_failed"], (took, events)  # at the timeout, not never
