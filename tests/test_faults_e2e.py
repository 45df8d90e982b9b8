"""The server under a failing disk and a second server, through the real CLI: no error ends the
runtime; an agent that cannot start answers each message at once, says why in /healthz and
recovers on its own; a stop always flushes memory; a refused start changes nothing; /healthz
never waits on a locked database and its status agrees with its body, for the token-less probe
too; the debris of a killed write is swept at start, and nothing else is."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.mock_bridge import MockBridge, Text, Turn
from devkit.mock_bridge.script import Fault
from sprite_os import runtime as runtime_mod
from sprite_os.config import Settings
from sprite_os.errors import LockHeld
from sprite_os.isolation.launch import AgentLaunch
from sprite_os.isolation.policy import AgentUser
from sprite_os.isolation.probe import MODE_FILE
from sprite_os.memory.capture.spill import status_path
from sprite_os.memory.system import BOOT_SETTLE_BUDGET
from sprite_os.server import SpriteOS
from tests.conftest import TOKEN, client_factory, running, wait_for
from tests.test_memory_e2e import turn

pytestmark = pytest.mark.e2e


def healthz(port: int, token: str | None = TOKEN) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@pytest.fixture
def read_only_prompt(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The boot prompt's folder on a read-only file system (EROFS) until the event is set."""
    fixed = threading.Event()
    write, unlink = AgentLaunch.write_prompt, Path.unlink

    def write_prompt(self: AgentLaunch, text: str) -> dict[str, str]:
        if not fixed.is_set():
            raise OSError(errno.EROFS, "Read-only file system", str(self.prompt_file))
        return write(self, text)

    def guarded_unlink(path: Path, missing_ok: bool = False) -> None:
        if path.name == "boot-prompt.md" and not fixed.is_set():
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        unlink(path, missing_ok=missing_ok)

    def check_writable(path: Path) -> None:  # the file system's read-only flag, as a remount sets it
        if not fixed.is_set():
            raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(AgentLaunch, "write_prompt", write_prompt)
    monkeypatch.setattr(Path, "unlink", guarded_unlink)
    monkeypatch.setattr(runtime_mod, "_check_writable", check_writable)
    yield fixed
    fixed.set()


async def test_a_read_only_disk_answers_each_message_at_once_says_why_and_recovers_on_its_own(
        bridge: MockBridge, settings: Settings, read_only_prompt: threading.Event) -> None:
    """Found by remounting the workspace read-only: discard_prompt's EROFS ended the runtime task,
    and every later message waited for ever, unanswered, while /healthz said `idle`."""
    read_only_prompt.set()
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        assert (await turn(c, "before"))["status"] == "completed"
        read_only_prompt.clear()  # the disk goes read-only
        await c.send(type="new_session")  # the CLI is closed; its boot prompt can't be removed
        await c.until("session_started")
        for n in range(2):  # each message: an error frame at once, saying why, and its turn over
            done = await turn(c, f"while read-only {n}")
            assert done["status"] == "error"
            error = next(f for f in c.of("error") if f.get("turn_id") == done["turn_id"])
            assert error["code"] == "agent_failed" and "Read-only file system" in error["message"]
        health = await asyncio.to_thread(healthz, app.port)
        assert health["status"] == "failed"
        failure = health["agent"]["failure"]
        assert "Read-only file system" in failure["reason"] and failure["failed_starts"] >= 1  # a message while failing is refused, not tried
        assert (await asyncio.to_thread(healthz, app.port, None)) == {"status": "failed"}
        read_only_prompt.set()  # the cause is gone: the runtime tries again on its own, no message needed
        await wait_for(lambda: not app.runtime.health.failed and app.runtime.cli_running, timeout=120,
                       what="the agent started on its own")
        assert (await asyncio.to_thread(healthz, app.port))["status"] == "ok"
        bridge.agent.script(Turn(Text("Back.")))
        assert (await turn(c, "after"))["status"] == "completed"


async def test_a_read_only_disk_answers_at_once_while_the_last_sessions_batch_is_still_curated(
        bridge: MockBridge, settings: Settings, read_only_prompt: threading.Event) -> None:
    """Each message went through the new session's wait for memory (15 s, the batch its end asked
    for still with the model) before finding that the agent could not start."""
    read_only_prompt.set()
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        assert (await turn(c, "before"))["status"] == "completed"
        bridge.faults.add(Fault("latency", seconds=60, target="curator", times=1))  # a slow model
        read_only_prompt.clear()  # the disk goes read-only
        await c.send(type="new_session")  # its end asks for a batch, which the model holds
        await c.until("session_started")
        for n in range(2):
            started = time.monotonic()
            assert (await turn(c, f"while read-only {n}"))["status"] == "error"
            assert time.monotonic() - started < BOOT_SETTLE_BUDGET / 2  # not after memory's wait
        read_only_prompt.set()
        bridge.faults.clear()


async def test_a_stop_flushes_memory_whatever_failed_before(bridge: MockBridge, settings: Settings,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM used to exit 1 with a traceback, skipping memory's flush, once the runtime had died."""
    app = SpriteOS(settings, TOKEN)
    await app.start()
    async with client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, "to be flushed")

    async def broken(_grace: float = 0.0) -> None:
        raise RuntimeError("the runtime's task died earlier")

    monkeypatch.setattr(app.runtime, "shutdown", broken)
    await app.stop()  # does not raise
    assert app.memory is not None and not app.memory._lock.held
    conn = sqlite3.connect(f"file:{settings.layout.transcript_db}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT user_message FROM observations").fetchall() == [("to be flushed",)]
    finally:
        conn.close()


def _fingerprint(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


async def _second_server_while_streaming(settings: Settings, bridge: MockBridge) -> None:
    """Start a second server on the workspace while the first streams a turn: it is refused, the
    first's turn completes, and isolation.json, the journal and the lock are as they were."""
    bridge.agent.script(Turn(Text("A long answer " + "word " * 60, chunk_delay=0.02)))
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await c.send(type="user_message", text="tell me a long story")
        await c.until("text_delta")  # streaming now
        mode_file = settings.layout.state_dir / MODE_FILE
        before = _fingerprint(mode_file)
        second = SpriteOS(settings.with_overrides(port=0), TOKEN)
        with pytest.raises(LockHeld):
            await second.start()
        await second.stop()  # a refused start has nothing to stop, and removes nothing
        assert _fingerprint(mode_file) == before
        done = await c.until("turn_complete")
        assert done["status"] == "completed" and not c.of("error")
        assert app.lock.held
    assert json.loads(mode_file.read_text())["mode"] == settings.isolation


async def test_a_second_server_is_refused_before_it_changes_anything(bridge: MockBridge, settings: Settings) -> None:
    await _second_server_while_streaming(settings, bridge)


async def test_a_second_server_on_a_deployed_workspace_leaves_the_first_ones_agent_alone(
        bridge: MockBridge, agent_settings: Settings, agent_user: AgentUser) -> None:
    """In user isolation a start kills every process of the agent's uid on a deployed workspace
    (its leftovers): a second server did so before it found the lock taken, and the first one's
    turn ended `agent_failed`."""
    layout = agent_settings.layout
    layout.os_dir.mkdir(parents=True, exist_ok=True)
    (layout.os_dir / "releases").mkdir(exist_ok=True)
    os.symlink("releases", layout.os_dir / "current")  # what a deploy leaves: the workspace is deployed
    await _second_server_while_streaming(agent_settings, bridge)


async def test_healthz_never_waits_on_a_locked_database_and_the_probe_sees_degraded_too(
        bridge: MockBridge, settings: Settings) -> None:
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, "one")
        async def counted() -> bool:
            return (await asyncio.to_thread(healthz, app.port))["memory"]["observations"].get("total") == 1

        await wait_for(counted, what="the turn counted")
        assert app.memory is not None
        hold = threading.Event()  # both database threads busy for as long as the test likes
        app.memory.transcript.submit(lambda _t: hold.wait(120))
        app.memory.memory.submit(lambda _m: hold.wait(120))
        try:
            await asyncio.sleep(1.1)  # past the counts' cache: /healthz would count again now
            health = await asyncio.wait_for(asyncio.to_thread(healthz, app.port), 10)
            assert health["status"] == "ok" and health["memory"]["observations"]["total"] == 1  # the last counts
            app.memory.writer.health.failing_since = 1.0  # capture's writes failing (a lock, a full disk)
            health = await asyncio.wait_for(asyncio.to_thread(healthz, app.port), 10)
            assert health["status"] == "degraded" and health["memory"]["capture"]["degraded"]
            assert await asyncio.to_thread(healthz, app.port, None) == {"status": "degraded"}
        finally:
            app.memory.writer.health.failing_since = None
            hold.set()


async def test_a_start_sweeps_what_a_killed_write_left_of_its_own_files_and_nothing_else(
        bridge: MockBridge, settings: Settings) -> None:
    """A kill -9 between atomic_write's temp file and its rename left the temp file for good (a
    history version's, found by `make chaos`). The sweep came back once the acknowledged turns a
    run had lost were found to be lost by acknowledging too early, not by the sweep."""
    layout = settings.layout
    history = layout.history_dir / "context.md"
    history.mkdir(parents=True)
    (layout.os_dir / "agent").mkdir(parents=True, exist_ok=True)
    debris = [history / ".000039_1795483438_batch-35.md.g2je4zm4.tmp", layout.memory_dir / ".user.md.x1abcdef.tmp",
              layout.state_dir / ".capture.json.abc_1234.tmp", layout.state_dir / ".turn-journal.json.k3j4h5g6.tmp",
              layout.state_dir / ".isolation.json.q9w8e7r6.tmp",
              layout.state_dir / ".cli.json.a1b2c3d4.tmp", layout.os_dir / "agent" / ".boot-prompt.md.zzzzzzzz.tmp",
              # recall's status for `memory status` and the stop's report (a `make chaos` slow-disk run left the first)
              layout.state_dir / ".recall.json.92425m_p.tmp", layout.state_dir / ".last-stop.json.abcd1234.tmp"]
    # v1's memory files migrate-v1 keeps, which the daemon's forget pass rewrites: its temp files there (written
    # after the backup was made), and the temp of the marker an unfinished `memory rebuild` leaves
    v1 = layout.os_dir / "backup" / "v1-20260101T000000Z" / "memory"
    debris += [v1 / ".user.md.h7g6f5d4.tmp", layout.memory_dir / ".rebuild-unfinished.p0o9i8u7.tmp",
               v1 / "..tools.md.a1s2d3f4.tmp.q1w2e3r4.tmp",  # its rewrite of v1's own leftover (below)
               v1 / ".user.md.forget-k9j8h7g6.tmp"]  # the pass's, named as its own: whatever its time (below)
    kept = [layout.memory_dir / "notes.tmp", layout.memory_dir / ".notes.md.abcdefgh.tmp",  # not Sprite OS's
            history / "000001_1_seed.md", layout.state_dir / ".service.env.abcdefgh.tmp",  # another process's
            layout.root / "documents" / ".draft.md.abcdefgh.tmp",  # the person's
            # v1's own leftover, moved with its memory/ (older than the backup), and what is not a memory file
            v1 / ".tools.md.a1s2d3f4.tmp", v1 / ".notes.txt.abcdefgh.tmp", v1 / "user.md",
            # the marker itself: it tells the next rebuild which memory.db was set aside (never swept)
            layout.memory_dir / "rebuild-unfinished"]
    for path in [*debris, *kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    os.utime(v1 / ".tools.md.a1s2d3f4.tmp", (1_767_225_000, 1_767_225_000))  # 2025-12-31, v1's time
    os.utime(v1 / ".user.md.forget-k9j8h7g6.tmp", (1_767_225_000, 1_767_225_000))  # a clock set back since
    async with running(settings):
        assert [p for p in debris if p.exists()] == []
        assert all(p.read_text() == "half" for p in kept)
    assert status_path(layout).exists()  # capture's status file stays allocated
    stop_report = layout.state_dir / ".last-stop.json.efgh5678.tmp"  # the server's own file: swept with memory off too
    stop_report.write_text("half")
    async with running(settings, memory=False):
        assert not stop_report.exists()


def scrape(port: int, token: str | None = TOKEN) -> tuple[int, str, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), ""


async def test_metrics_in_the_prometheus_text_format_for_the_token_holder(
        bridge: MockBridge, settings: Settings) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    bridge.curator.default = "FACT: something was said [#1]"
    async with running(settings.with_overrides(memory_batch_turns=2)) as app, client_factory(app.port) as client:
        c = await client(hello={})
        for n in range(2):
            await turn(c, f"turn {n}")
        assert app.memory is not None
        await wait_for(lambda: app.memory is not None and app.memory.daemon.health.batches_run == 1, timeout=30)

        async def counted() -> bool:  # the turns' counts wait 0.5 s at most, then the last ones stand
            return (await app.health())["memory"]["observations"].get("processed") == 2

        await wait_for(counted, timeout=30, what="the batch's turns counted")
        assert (await asyncio.to_thread(scrape, app.port, None))[0] == 401
        assert (await asyncio.to_thread(scrape, app.port, "wrong-token-0123456789"))[0] == 401
        status, content_type, text = await asyncio.to_thread(scrape, app.port)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("sprite_turns_total", (("status", "completed"),))] == 2
    assert samples[("sprite_turn_duration_seconds_count", ())] == 2
    assert samples[("sprite_agent_state", (("state", "idle"),))] == 1
    assert samples[("sprite_agent_failed", ())] == 0 and samples[("sprite_up", ())] == 1
    assert samples[("sprite_capture_queued", ())] == 0 and samples[("sprite_capture_spilled", ())] == 0
    assert samples[("sprite_turns_recorded", (("state", "processed"),))] == 2
    assert samples[("sprite_curator_calls_total", ())] == 1 and samples[("sprite_curator_failed_calls_total", ())] == 0
    assert ("sprite_curator_cost_usd_total", ()) in samples and ("sprite_recall_index_backlog", ()) in samples
    # the agent's spending as the relay counted it from the two replies' usage, and its cap
    assert samples[("sprite_agent_spent_today_usd", ())] > 0
    assert samples[("sprite_agent_daily_budget_usd", ())] == settings.agent_daily_budget_usd
