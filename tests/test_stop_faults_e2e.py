"""The stop path under faults: a second signal during the stop, and a SIGTERM during start-up.
The promise (docs/deploy.md, "What a stop does"): a SIGTERM starts one deadline; memory's flush runs
whole within its share and the process is gone before the service's SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from signal import SIGINT, SIGTERM
from typing import TYPE_CHECKING

import pytest

from devkit.harness import make_settings, running, wait_for
from devkit.mock_bridge import Fault, MockBridge, Text, Turn
from devkit.processes import ServerProcess, pid_alive, workspace_clis
from sprite_os.memory.schema import PENDING, PROCESSED
from sprite_os.stopping import STOP_REPORT
from tests.conftest import Client, client_factory, observed

if TYPE_CHECKING:
    from sprite_os.server import SpriteOS

pytestmark = pytest.mark.e2e

STOP_TIMEOUT = 10.0  # a sixth of the service's: every share scales alike (stopping.py)


async def hung_stop_server(workspace: Path, bridge: MockBridge) -> ServerProcess:
    """tests/stop_server.py's server (its CLI ignores interrupts), at this module's stop timeout."""
    return await ServerProcess(workspace, bridge.url, module="tests.stop_server",
                               STOP_TEST_TIMEOUT=str(STOP_TIMEOUT)).start()


async def stops_in_time(proc: ServerProcess) -> None:
    """SIGTERM: the stop runs its steps within the stop timeout as the server measures it (its loop's
    clock, from the signal), and the process exits 0, the stop ended: had a step overrun, the exit guard
    would have ended the process at the deadline with 1 (test_stop_deadline_e2e.py tests the guard). The
    wait for the exit has no bound of the stop's: when this test hears of it is the host's load."""
    proc.signal(SIGTERM)
    code = await proc.wait(timeout=STOP_TIMEOUT + 60)
    took = proc.stop_seconds()
    assert code == 0 and took is not None and took < STOP_TIMEOUT, \
        f"stopped after {took} s, exit {code}\n{proc.log.read_text()[-2500:]}"


async def logged(proc: ServerProcess, event: str) -> None:
    """The server has logged `event` (its log is written line by line): a moment of its start or stop."""
    await wait_for(lambda: proc.log.exists() and f'"{event}"' in proc.log.read_text(), 60, interval=0.1,
                   what=f"{event} in the server's log")


async def kept_then_streaming(c: Client, workspace: Path) -> list[int]:
    """One turn acknowledged (KEPT-77), then a long one streaming (FIG-93) whose CLI ignores its
    interrupt, so a stop waits out its turn's grace: the workspace's CLIs."""
    await c.send(type="user_message", text="keep this one: KEPT-77")
    await c.until("turn_complete")
    await c.send(type="user_message", text="a long one: FIG-93")
    await c.until("text_delta")
    clis = workspace_clis(workspace)
    assert clis
    return clis


async def stop_begun(proc: ServerProcess, c: Client, workspace: Path, sig: int, moment: str) -> list[int]:
    """A turn acknowledged and a long one streaming, then `sig`, until the server's log says `moment`
    (a moment of the stop): the workspace's CLIs."""
    clis = await kept_then_streaming(c, workspace)
    proc.signal(sig)
    await logged(proc, moment)
    return clis


@pytest.mark.parametrize("sig", [SIGTERM, SIGINT])
async def test_a_second_signal_during_the_stop_does_not_cut_it(workspace: Path, bridge: MockBridge,
                                                               sig: int) -> None:
    """An impatient operator (a second `service stop`, a second Ctrl-C): the stop already under way
    must still flush memory and end the CLI, not die at once with the signal's default action."""
    bridge.agent.script(Turn(Text("Kept.")), Turn(Text("word " * 3000, chunk_delay=0.1)))
    proc = await hung_stop_server(workspace, bridge)
    try:
        async with client_factory(proc.port) as client:
            clis = await stop_begun(proc, await client(hello={}), workspace, sig, "server_stopping")
            proc.signal(sig)  # again, while the stop is under way (its turn's grace alone lasts 5 s)
            code = await proc.wait(timeout=STOP_TIMEOUT + 30)
        log = proc.log.read_text()
        left = [pid for pid in clis if pid_alive(pid)]
        said = f"exit {code}; CLIs left {left}\n{log[-2500:]}"
        # The second signal was heard and let be: the stop went on and ended the CLI, and the process
        # ended the stop's way, not the signal's (a negative code).
        assert '"stop_signal_repeated"' in log and code >= 0, said
        assert not left, said
        # The stop ran to its end, or to its deadline's. Whether its steps fit their shares is the
        # machine's speed (a loaded one spends them all: the turn's grace alone is half), not this
        # test's: a stop cut by its deadline exits non-zero, as it must, and says what it cut
        # (test_stop_deadline_e2e.py tests the deadline).
        assert '"server_stopped"' in log if code == 0 else _cut_by_the_deadline(log), said
    finally:
        await proc.stop()
        for pid in workspace_clis(workspace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


async def test_sigterm_during_start_up_is_met_within_the_stop_timeout(workspace: Path, bridge: MockBridge) -> None:
    """A SIGTERM while memory starts (a forget's resume after a kill, a long replay) is the service's
    stop too: its SIGKILL comes the stop timeout after it, whatever the start was doing."""
    # The guard ends the process a sixtieth of the timeout before the SIGKILL: at 20 s that is 333 ms, a
    # margin a loaded machine's scheduling keeps (167 ms at 10 s is thinner than this test should lean on).
    timeout = 2 * STOP_TIMEOUT
    slow = 3 * timeout
    proc = await ServerProcess(workspace, bridge.url, module="tests.stop_server_slow_start",
                               STOP_TEST_TIMEOUT=str(timeout), HOSTILE_SLOW_START=str(slow)).spawn()
    try:
        await logged(proc, "slow_resume")
        asked = time.monotonic()
        proc.signal(SIGTERM)
        # Judged as `sprite-os service stop` judges it: is the process still alive (a zombie is not) when
        # the SIGKILL comes? Not by when this test's loop hears of the exit, which a busy machine delays.
        with contextlib.suppress(TimeoutError):
            await proc.wait(timeout=timeout)
        alive_at_kill = pid_alive(proc.pid)
        code = await proc.wait(timeout=slow + 30)
        took = time.monotonic() - asked
        log = proc.log.read_text()
        assert not alive_at_kill, f"alive when the service's SIGKILL came, {timeout:g} s after SIGTERM (gone " \
                                  f"after {took:.1f} s, exit {code})\n{log[-2000:]}"
        # The start is not cut (it runs on, past the deadline): the guard ends the process, and says the
        # stop did not finish.
        assert code == 1 and '"exit_forced"' in log, log[-2000:]
        # So does its account for `sprite-os service stop`, which deleted it before the SIGTERM: memory's stop
        # never ran. It used to be absent, read as an account with nothing unfinished: "stopped", exit 0.
        report = json.loads((make_settings(workspace, bridge.url).layout.state_dir / STOP_REPORT).read_text())
        assert report == {"unfinished": ["memory"]}
    finally:
        await proc.stop()


def next_start(workspace: Path, bridge: MockBridge) -> AbstractAsyncContextManager[SpriteOS]:
    """The start after a stopped or killed one, in this process: what it recovers is the start's
    work, not the process's, and a server subprocess costs a second of CPU more (tests/README.md)."""
    return running(make_settings(workspace, bridge.url))


def _cut_by_the_deadline(log: str) -> bool:
    return any(f'"{event}"' in log for event in ("server_stop_step_cut", "memory_stop_step_cut", "exit_forced"))


def _states(workspace: Path, base_url: str) -> list[tuple[str, object]]:
    return observed(workspace, base_url, "processed")


async def test_a_hung_curator_at_the_stop_is_cut_and_its_batch_runs_at_the_next_start(
        workspace: Path, bridge: MockBridge) -> None:
    """The curator's proxy hangs during the stop's flush: the flush's share cuts it, the process is gone
    before the SIGKILL, and the turns stay pending for the next start, which curates them."""
    bridge.agent.script(Turn(Text("Noted.")))
    bridge.curator.default = "FACT: the plum is called PLUM-41 [#1]"
    proc = await ServerProcess(workspace, bridge.url, STOP_TEST_TIMEOUT=str(STOP_TIMEOUT),
                               module="tests.stop_server_slow_start").start()
    try:
        async with client_factory(proc.port) as client:
            c = await client(hello={})
            await c.send(type="user_message", text="remember PLUM-41")
            await c.until("turn_complete")
        hang = bridge.faults.add(Fault("latency", seconds=3600, target="curator"))
        await stops_in_time(proc)
    finally:
        await proc.stop()
    assert _states(workspace, bridge.url) == [("remember PLUM-41", PENDING)]
    report = json.loads((make_settings(workspace, bridge.url).layout.state_dir / STOP_REPORT).read_text())
    assert report == {"unfinished": ["flush"]}  # what `service stop` says, exiting non-zero
    bridge.faults.remove(hang)
    async with next_start(workspace, bridge):
        await wait_for(lambda: _states(workspace, bridge.url) == [("remember PLUM-41", PROCESSED)], 30,
                       interval=0.1, what="the pending turn curated at the next start")


async def test_a_stop_while_another_process_locks_transcript_db_loses_no_acknowledged_turn(
        workspace: Path, bridge: MockBridge) -> None:
    """Another process holds transcript.db's write lock (a `sqlite3` shell left open) across a turn and
    the stop: the process is still gone before the SIGKILL, and the acknowledged turn lands at the next
    start (from the spill file or the journal)."""
    bridge.agent.script(Turn(Text("Noted.")))
    proc = await ServerProcess(workspace, bridge.url, STOP_TEST_TIMEOUT=str(STOP_TIMEOUT),
                               module="tests.stop_server_slow_start").start()
    holder = sqlite3.connect(make_settings(workspace, bridge.url).layout.transcript_db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        async with client_factory(proc.port) as client:
            c = await client(hello={})
            await c.send(type="user_message", text="remember LOCKED-12")
            await c.until("turn_complete")
        await stops_in_time(proc)
    finally:
        holder.rollback()
        holder.close()
        await proc.stop()
    async with next_start(workspace, bridge):
        pass
    assert [m for m, _ in _states(workspace, bridge.url)] == ["remember LOCKED-12"]


@pytest.mark.parametrize("moment", ["server_stopping", "memory_stopping"])
async def test_a_kill_during_the_stop_is_recovered_at_the_next_start(workspace: Path, bridge: MockBridge,
                                                                    moment: str) -> None:
    """SIGKILL to the server alone once its log says `moment` (the stop begun: in the turn's grace,
    the CLI still running; memory's steps begun: past the grace and the CLI's end): the CLI it leaves
    is reaped at the next start, and the acknowledged turn is there."""
    bridge.agent.script(Turn(Text("Kept.")), Turn(Text("word " * 3000, chunk_delay=0.1)))
    proc = await hung_stop_server(workspace, bridge)
    try:
        async with client_factory(proc.port) as client:
            clis = await stop_begun(proc, await client(hello={}), workspace, SIGTERM, moment)
            proc.signal(9)
            assert await proc.wait(timeout=30) == -9
    finally:
        await proc.stop()
    try:
        async with next_start(workspace, bridge):
            left = [pid for pid in clis if pid_alive(pid)]
            assert not left, left
    finally:
        for pid in clis:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
    said = [m for m, _ in _states(workspace, bridge.url)]
    assert any("KEPT-77" in m for m in said), said
