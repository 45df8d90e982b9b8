"""The agent's CLI as its own user (SPRITE_ISOLATION=user), end to end: the real CLI, the mock Bridge.

The kernel keeps it out of `.os/`; the server ends it, and everything it started, at shutdown, at an
idle timeout, and when the server is killed with -9. (The many ways of attacking `.os/` are in the
red-team suite; here, the machinery.)
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from devkit.processes import refused_serve
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from sprite_os.server import SpriteOS
from tests.conftest import (
    TOKEN,
    Connect,
    ServerProcess,
    agent_namespace,
    client_factory,
    in_namespace,
    running,
    wait_for,
)

pytestmark = pytest.mark.e2e


def healthz(port: int) -> dict[str, object]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        body: dict[str, object] = json.loads(response.read())
    return body


async def test_the_agent_runs_as_its_user_and_the_kernel_keeps_it_out_of_os(
        agent_server: SpriteOS, agent_client: Connect, bridge: MockBridge, agent_user: AgentUser,
        agent_workspace: Path) -> None:
    memory_file = agent_workspace / ".os" / "memory" / "user.md"
    memory_file.write_text("- Ada likes tea\n")
    before = memory_file.read_bytes()
    attack = "echo pwned >> .os/memory/user.md; touch .os/x; mv .os .osx; cat .os/token > documents/token"
    (agent_workspace / "documents" / "attack.sh").write_text(attack)
    bridge.agent.script(Turn(ToolCall("Bash", {"command": "id -u > documents/uid; id -G > documents/groups; "
                                                          "bash documents/attack.sh"}), Text("Tried.")))
    c = await agent_client(hello={})
    await c.send(type="user_message", text="who are you?")
    done = await c.until("turn_complete")
    assert done["status"] == "completed", c.of("tool_result")
    assert (agent_workspace / "documents" / "uid").exists(), [f["summary"] for f in c.of("tool_result")]
    assert (agent_workspace / "documents" / "uid").read_text().strip() == str(agent_user.uid)
    assert (agent_workspace / "documents" / "groups").read_text().split() == [str(agent_user.gid)]  # not root's
    assert memory_file.read_bytes() == before
    assert not (agent_workspace / ".os" / "x").exists() and not (agent_workspace / ".osx").exists()
    assert (agent_workspace / "documents" / "token").read_text() == ""
    assert (await asyncio.to_thread(healthz, agent_server.port))["isolation"] == "user"
    prompt = agent_workspace / ".os" / "agent" / "boot-prompt.md"
    st = prompt.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, agent_user.gid, 0o640)
    assert memory_status(agent_workspace)["isolation"]["mode"] == "user"
    # The CLI kept no transcript of its own in its home (--no-session-persistence): memory has the record.
    projects = agent_user.home / ".claude" / "projects"
    project = re.sub(r"[^A-Za-z0-9]", "-", str(agent_workspace))  # how the CLI names a cwd's folder
    assert not (projects / project).exists()


def memory_status(workspace: Path) -> dict[str, Any]:
    import contextlib
    import io

    from sprite_os.commands.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--workspace", str(workspace), "memory", "status", "--json"]) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


async def test_without_isolation_healthz_and_memory_status_say_so(server: SpriteOS, workspace: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from sprite_os.commands.main import main

    assert (await asyncio.to_thread(healthz, server.port))["isolation"] == "none"
    assert memory_status(workspace)["isolation"]["mode"] == "none"
    capsys.readouterr()
    assert main(["--workspace", str(workspace), "memory", "status"]) == 0
    assert "agent isolation  none  -- NOT ISOLATED" in capsys.readouterr().out


async def test_shutdown_ends_every_process_the_agent_started_even_daemons(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    bridge.agent.script(Turn(ToolCall("Bash", {"command": "(setsid sleep 300 >/dev/null 2>&1 &); nohup sleep 301 "
                                                          ">/dev/null 2>&1 & echo started"}), Text("Started.")))
    async with running(agent_settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="start a daemon")
        await c.until("turn_complete")
        ns = agent_namespace(agent_user.uid, agent_workspace)
        assert len(in_namespace(ns)) >= 3  # the CLI, and the two sleeps
    assert in_namespace(ns) == []
    assert not (agent_workspace / ".os" / "agent" / "boot-prompt.md").exists()


async def test_an_idle_timeout_ends_every_process_the_agent_started(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    from dataclasses import replace

    bridge.agent.script(Turn(ToolCall("Bash", {"command": "(setsid sleep 300 >/dev/null 2>&1 &); echo ok"}),
                             Text("Started.")))
    async with running(replace(agent_settings, idle_timeout=1.0)) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="start a daemon")
        await c.until("turn_complete")
        ns = agent_namespace(agent_user.uid, agent_workspace)
        await c.until("session_ended", lambda f: f["reason"] == "idle", timeout=30)
        await wait_for(lambda: in_namespace(ns) == [], timeout=10)


async def test_a_server_killed_with_9_takes_the_agent_and_its_daemons_with_it(
        bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    server = await ServerProcess(agent_workspace, bridge.url, SPRITE_ISOLATION="user",
                                 SPRITE_AGENT_USER=agent_user.name).start()
    try:
        assert (await asyncio.to_thread(healthz, server.port))["isolation"] == "user"
        bridge.agent.script(Turn(ToolCall("Bash", {"command": "(setsid sleep 300 >/dev/null 2>&1 &); echo ok"}),
                                 Text("Started.")))
        async with client_factory(server.port) as connect:
            c = await connect(hello={})
            await c.send(type="user_message", text="start a daemon")
            await c.until("turn_complete")
            ns = agent_namespace(agent_user.uid, agent_workspace)
            server.signal(signal.SIGKILL)
            await server.wait()
        await wait_for(lambda: in_namespace(ns) == [], timeout=10)
    finally:
        if server.proc is not None and server.proc.returncode is None:
            server.signal(signal.SIGKILL)
            await server.wait()


# ---------------------------------------------------------------- sandbox mode (a developer's machine)


@pytest.fixture
def sandbox_settings(settings: Settings) -> Settings:
    from dataclasses import replace

    from sprite_os.isolation.probe import sandbox_problem

    if problem := sandbox_problem():
        pytest.skip(f"the CLI's sandbox can't work here: {problem}")
    return replace(settings, isolation="sandbox")


async def test_in_the_sandbox_a_command_cannot_write_os_but_honest_work_works(
        sandbox_settings: Settings, bridge: MockBridge, workspace: Path) -> None:
    bridge.agent.script(Turn(ToolCall("Bash", {"command": "echo notes > documents/notes.md; cat <<'EOF' > documents/prose.md\n"
                                                          "The .os folder is where memory lives.\nEOF\n"
                                                          "echo pwned >> .os/memory/user.md; touch .os/x; echo $? > documents/rc; "
                                                          "cat .os/token > documents/token"}),
                             Text("Tried.")))
    async with running(sandbox_settings) as app, client_factory(app.port) as connect:
        memory_file = workspace / ".os" / "memory" / "user.md"
        memory_file.write_text("- Ada likes tea\n")
        assert (await asyncio.to_thread(healthz, app.port))["isolation"] == "sandbox"
        c = await connect(hello={})
        await c.send(type="user_message", text="write some notes")
        done = await c.until("turn_complete", timeout=60)
    assert done["status"] == "completed"
    summaries = [f["summary"] for f in c.of("tool_result")]
    assert (workspace / "documents" / "notes.md").read_text() == "notes\n", summaries
    assert (workspace / "documents" / "prose.md").read_text() == "The .os folder is where memory lives.\n"
    assert (workspace / "documents" / "rc").read_text().strip() != "0"  # a read-only file system
    assert not (workspace / ".os" / "x").exists()
    assert memory_file.read_text() == "- Ada likes tea\n"  # readable, but bound read-only
    assert (workspace / "documents" / "token").read_text() == ""


def test_a_deployed_sprite_refuses_to_start_without_isolation(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".os").mkdir(parents=True)
    os.symlink("releases/1.0", ws / ".os" / "current")  # what bootstrap/deploy.py makes
    env = {**os.environ, "SPRITE_WORKSPACE": str(ws), "SPRITE_OS_PORT": "0", "SPRITE_ISOLATION": "none"}
    run = refused_serve(env, 60)
    assert run.returncode == 2 and run.stdout == "[]\n"  # refused before the server's import
    assert run.stderr.strip().endswith("a deployed Sprite never runs its agent without isolation: SPRITE_ISOLATION=none")
