"""The server process's start-up failures: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from devkit.processes import refused_serve
from sprite_os.config import Settings
from tests.conftest import TOKEN, running


async def test_a_port_in_use_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "SPRITE_WORKSPACE": str(workspace), "SPRITE_OS_PORT": str(port),
               "SPRITE_OS_HOST": "127.0.0.1", "SPRITE_OS_TOKEN": TOKEN, "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sprite_os", "serve", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert text.strip().splitlines()[-1] == f"sprite-os: error: cannot listen on 127.0.0.1:{port}: Address already in use"


async def test_a_missing_model_proxy_is_warned_about_at_start(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    from tests.conftest import make_settings, running

    for base_url, warned in ((None, True), ("http://127.0.0.1:9", False)):
        with capture_logs() as logs:
            async with running(make_settings(tmp_path / f"ws-{warned}", base_url)):  # type: ignore[arg-type]
                pass
        assert any(e["event"] == "model_proxy_unset" and e["log_level"] == "warning" for e in logs) is warned


def test_the_server_starts_without_the_curators_sdk() -> None:
    """The anthropic SDK took more than half of `import sprite_os.server` (seconds, every start);
    the curator, its one user, imports it at its first call."""
    import subprocess

    probe = "import sys, sprite_os.server; print(sorted(m for m in sys.modules if m.split('.')[0] == 'anthropic'))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout == "[]\n"


def test_a_server_starts_serves_and_stops_without_the_agents_sdk(tmp_path: Path) -> None:
    """The agent SDK (its MCP types: over a second of CPU) loads with the first agent, not with the
    server: a start that serves no turn (a deploy's restart, a console visit) pays none of it. The
    CLI it bundles (user isolation copies it) is found without importing it."""
    import subprocess

    from devkit.processes import kit_env

    probe = ("import asyncio, json, sys, urllib.request\n"
             "from pathlib import Path\n"
             "from devkit.harness import make_settings, running\n"
             "from sprite_os.agent.process import bundled_cli\n"
             "async def main():\n"
             "    async with running(make_settings(Path(sys.argv[1]), 'http://127.0.0.1:9')) as app:\n"
             "        url = f'http://127.0.0.1:{app.port}/healthz'\n"
             "        return json.load(await asyncio.to_thread(urllib.request.urlopen, url, None, 30))['status']\n"
             "status = asyncio.run(main())\n"
             "cli = bundled_cli()\n"
             "print(status, cli.is_file(), sorted({m.split('.')[0] for m in sys.modules} & {'claude_agent_sdk', 'mcp'}))")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "ws")], capture_output=True, text=True,
                          timeout=120, check=False, env=kit_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "ok True []", done.stdout


# A runtime's first turn, in a fresh interpreter, with the SDK's client faked: which thread imported
# the agent SDK (the loop's, or another), and the turn's status.
_FIRST_TURN_PROBE = """
import asyncio, sys, threading
from pathlib import Path
from types import SimpleNamespace
from devkit.harness import make_settings
from sprite_os import protocol as p
from sprite_os.runtime import AgentRuntime
from sprite_os.tools.canvas import CanvasStore

importers = []

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "claude_agent_sdk":
            importers.append("loop" if threading.current_thread() is threading.main_thread() else "thread")
        return None

sys.meta_path.insert(0, Spy())

class FakeCLI:
    def __init__(self, _options):
        self._transport = SimpleNamespace(_process=SimpleNamespace(pid=4242, returncode=None))
    async def connect(self): pass
    async def query(self, text): pass
    async def receive_response(self):
        from claude_agent_sdk import ResultMessage
        yield ResultMessage(subtype="success", duration_ms=1, duration_api_ms=1, is_error=False, num_turns=1,
                            session_id="x", usage={"input_tokens": 1, "output_tokens": 1})
    async def interrupt(self): pass
    async def disconnect(self): pass

async def main():
    settings = make_settings(Path(sys.argv[1]), "http://127.0.0.1:9")
    settings.layout.ensure()
    frames = []
    rt = AgentRuntime(settings, publish=frames.append, canvas_store=CanvasStore(settings.layout.canvas_file,
                      frames.append), model_env=dict, client_factory=FakeCLI)
    await rt.start()
    rt.submit("hi")
    async with asyncio.timeout(60):
        while not any(isinstance(f, p.TurnComplete) for f in frames):
            await asyncio.sleep(0.01)
    await rt.shutdown(5)
    return next(f for f in frames if isinstance(f, p.TurnComplete)).status

status = asyncio.run(main())
print(status, importers)
"""


def test_the_first_turn_imports_the_agents_sdk_off_the_event_loop(tmp_path: Path) -> None:
    """The agent SDK's import (a second of CPU) waits for the first agent; made on the loop, it
    would hold up every connection, the console and /healthz at every server's first turn."""
    import subprocess

    from devkit.processes import kit_env

    done = subprocess.run([sys.executable, "-c", _FIRST_TURN_PROBE, str(tmp_path / "ws")], capture_output=True,
                          text=True, timeout=120, check=False, env=kit_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "completed ['thread']", done.stdout


def test_the_command_line_imports_no_sdk_until_a_command_needs_one() -> None:
    """Every `sprite-os` run (service start/stop/status, a deploy's steps, version) builds the whole
    parser: building it imported the agent SDK through memory's modules (seconds each time)."""
    import subprocess

    probe = ("import sys; from sprite_os.commands.main import main; main(['version']); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'claude_agent_sdk', 'anthropic', 'mcp', 'numpy'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines()[-1] == "[]"


async def raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4000), 30)
    finally:
        writer.close()


async def test_a_repeated_authorization_or_origin_header_is_a_400_without_a_traceback(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """websockets' headers.get raises on a repeated header: each such request was a 500 and an
    error-level traceback in the log."""
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    upgrade = (b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
    async with running(settings) as app:
        caplog.set_level(logging.INFO)
        with capture_logs() as logs:
            for request in (
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\n" + auth + b"\r\n",
                b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth + auth + b"\r\n",
                b"GET / HTTP/1.1\r\nHost: x\r\n" + upgrade + auth
                + b"Origin: http://x\r\nOrigin: http://evil.example\r\n\r\n",
            ):
                answer = await raw_request(app.port, request)
                assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert not [e for e in logs if e["log_level"] in ("error", "critical")], logs
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text  # websockets' own
        ok = await raw_request(app.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        assert ok.startswith(b"HTTP/1.1 200 ")  # one of each: served as before


async def test_a_refused_start_writes_nothing_not_even_its_log_or_a_token(tmp_path: Path) -> None:
    """`sprite-os serve` created the token file and opened its log file before it found the
    workspace's lock held by the server already running there."""
    from sprite_os.fsutil import WriterLock
    from sprite_os.paths import Layout

    workspace = tmp_path / "workspace"
    layout = Layout(workspace)
    layout.memory_dir.mkdir(parents=True)

    def tree() -> dict[str, int | None]:
        return {str(p.relative_to(workspace)): p.stat().st_mtime_ns if p.is_file() else None
                for p in workspace.rglob("*")}

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "ANTHROPIC_"))}
    env.update(SPRITE_WORKSPACE=str(workspace), SPRITE_OS_PORT="0", SPRITE_OS_HOST="127.0.0.1",
               SPRITE_ISOLATION="none", SPRITE_LOG_FILE=str(layout.state_dir / "server.log"),
               ANTHROPIC_BASE_URL="http://127.0.0.1:9")
    with WriterLock(layout.memory_lock, WriterLock.SERVER):  # the first server
        before = tree()
        run = await asyncio.to_thread(refused_serve, env, 60)
        after = tree()  # while the first server holds it (its note is cleared as it lets go)
    assert run.returncode != 0 and "another process holds this workspace" in run.stderr
    assert run.stdout == "[]\n"  # refused before the server's import: the agent SDK was never loaded
    assert after == before



async def _stopped_with_a_request_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
                                            hangs: bool) -> tuple[list[str], list[tuple[str, str, str | None]]]:
    """A files_list being answered when the server is told to stop (it ends once the client has sent
    another, or never), and one sent after: what happened in which order, and what the client got."""
    from sprite_os.console.files_api import FilesConsole
    from sprite_os.server import SpriteOS
    from tests.conftest import client_factory, make_settings

    events: list[str] = []
    started, release, files_stopped = asyncio.Event(), asyncio.Event(), asyncio.Event()
    listing, stop_files = FilesConsole._list, FilesConsole.stop

    async def slow_list(self: FilesConsole, req: Any) -> Any:
        events.append("request start")
        started.set()
        await (asyncio.Event() if hangs else release).wait()
        answer = await listing(self, req)  # the files are still there to answer it
        events.append("request end")
        return answer

    async def stopped(self: FilesConsole) -> None:
        events.append("files stop")
        files_stopped.set()
        await stop_files(self)

    monkeypatch.setattr(FilesConsole, "_list", slow_list)
    monkeypatch.setattr(FilesConsole, "stop", stopped)
    app = SpriteOS(make_settings(tmp_path / "workspace", "http://127.0.0.1:9"), TOKEN, memory=False)
    await app.start()
    frames: list[dict[str, Any]] = []
    stopping: asyncio.Task[None] | None = None
    try:
        async with client_factory(app.port) as connect:
            c = await connect(hello={})
            await c.send(type="files_list", request_id="l1", path="")
            await asyncio.wait_for(started.wait(), 10)
            stopping = asyncio.create_task(app.stop())
            while not app.gateway.stopping:
                await asyncio.sleep(0.01)
            await c.send(type="files_list", request_id="l2", path="")  # too late: not taken
            if hangs:  # the stop must not wait for ever: the files stop while the request still hangs
                await asyncio.wait_for(files_stopped.wait(), 30)
            else:  # a moment in which a stop that did not wait would have stopped the files
                await asyncio.sleep(0.3)
            events.append("waited")
            release.set()
            await asyncio.wait_for(stopping, 30)
            with contextlib.suppress(Exception):  # until the server's close
                while True:
                    frames.append(await c.recv(timeout=5))
    finally:
        if stopping is None:
            await app.stop()
    return events, sorted((f["request_id"], f["type"], f.get("code")) for f in frames if "request_id" in f)


async def test_a_stop_lets_the_requests_in_flight_end_before_it_stops_the_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events, answers = await _stopped_with_a_request_in_flight(tmp_path, monkeypatch, hangs=False)
    assert events == ["request start", "waited", "request end", "files stop"]
    assert answers == [("l1", "files_list_result", None), ("l2", "error", "shutting_down")]


async def test_a_request_that_outlasts_the_stops_grace_is_cut_and_its_client_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os import stopping

    monkeypatch.setattr(stopping, "REQUEST_GRACE", 0.1)
    events, answers = await _stopped_with_a_request_in_flight(tmp_path, monkeypatch, hangs=True)
    assert events == ["request start", "files stop", "waited"]  # the stop did not wait for ever
    assert answers == [("l1", "error", "shutting_down"), ("l2", "error", "shutting_down")]


def test_the_stop_asked_account_is_written_without_holding_the_loop_on_an_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal handler writes "memory's stop did not finish" before the stop begins, on the loop: an
    fsync there (a slow disk's hundreds of ms) held the whole stop up. `service stop` reads it from this
    machine's page cache right after the exit."""
    import json

    from devkit.harness import make_settings
    from sprite_os import deploy_contract
    from sprite_os.server import SpriteOS
    from sprite_os.stopping import STOP_REPORT

    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    settings.layout.ensure()
    app = SpriteOS(settings, TOKEN)
    synced: list[int] = []
    monkeypatch.setattr(deploy_contract.os, "fsync", synced.append)
    app.stop_asked()
    assert json.loads((settings.layout.state_dir / STOP_REPORT).read_text()) == {"unfinished": ["memory"]}
    assert synced == []
