"""A stop within the service's timeout, however its steps hang (stopping.py's one deadline).

The server runs as its own process (tests/stop_server.py) with a request that never ends, a turn
whose CLI ignores its interrupt, and a forget's decision stuck on a thread that never returns. A
SIGTERM still lands the turns and flushes memory within the deadline, and the process is gone before
the service's SIGKILL would come: the turn recorded just before is in transcript.db at the next start.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from signal import SIGTERM

import pytest

from devkit.harness import make_settings, running
from devkit.mock_bridge import MockBridge, Text, Turn
from devkit.processes import ServerProcess, pid_alive, workspace_clis
from tests.conftest import client_factory

pytestmark = pytest.mark.e2e

# A sixth of the service's: every share scales alike (stopping.py), so the hung steps are waited out in
# 10 s (the turn's grace 5 s, memory's reserve 3.3 s, the exit guard 1/6 s before the SIGKILL).
STOP_TIMEOUT = 10.0


def _user_messages(workspace: Path, base_url: str) -> list[str]:
    db = sqlite3.connect(make_settings(workspace, base_url).layout.transcript_db)
    try:
        return [row[0] for row in db.execute("SELECT user_message FROM observations")]
    finally:
        db.close()


async def test_sigterm_with_every_step_hung_flushes_memory_and_exits_before_the_kill(
        workspace: Path, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("Noted.")), Turn(Text("Kept.")), Turn(Text("word " * 3000, chunk_delay=0.1)))
    proc = await ServerProcess(workspace, bridge.url, module="tests.stop_server",
                               STOP_TEST_TIMEOUT=str(STOP_TIMEOUT)).start()
    try:
        async with client_factory(proc.port) as client:
            c = await client(hello={})
            await c.send(type="user_message", text="forget this one: PLUM-41")
            first = (await c.until("turn_complete"))["turn_id"]
            await c.send(type="user_message", text="keep this one: KEPT-77")
            await c.until("turn_complete", lambda f: f["turn_id"] != first)  # durable: the person was told
            await c.send(type="forget_turns", request_id="f", turn_ids=[first])
            assert (await c.until("forget_turns_result"))["forgotten"] == 1  # its decision now hangs
            await c.send(type="files_list", request_id="l", path="")  # never answered
            await c.send(type="user_message", text="a long one: FIG-93")
            await c.until("text_delta")  # the turn that never ends
            clis = workspace_clis(workspace)
            assert clis
            proc.signal(SIGTERM)
            code = await proc.wait(timeout=STOP_TIMEOUT + 60)  # when this test hears of it is the host's load
        log = proc.log.read_text()
        # The stop's steps within the deadline as the server measures it (its loop's clock, from the
        # signal), and the process ended by its exit guard with 0: the stop ended, memory flushed, whatever
        # a thread still held (a stop past the deadline is ended there with 1).
        took = proc.stop_seconds()
        assert took is not None and took < STOP_TIMEOUT, f"stopped after {took} s: the service would have killed " \
                                                         f"it\n{log[-3000:]}"
        assert code == 0, log[-3000:]
        assert '"server_stopped"' in log and '"exit_forced"' in log  # the stuck thread's exit was forced
        assert not [pid for pid in clis if pid_alive(pid)]
    finally:
        await proc.stop()
    async with running(make_settings(workspace, bridge.url)):  # the journal and spill file land at start
        pass
    said = _user_messages(workspace, bridge.url)
    assert any("KEPT-77" in text for text in said)
    assert any("FIG-93" in text for text in said)  # the turn cut by the stop, recorded as it stood
    assert not any("PLUM-41" in text for text in said)
