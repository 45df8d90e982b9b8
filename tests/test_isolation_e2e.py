"""The agent's CLI as its own user (SPRITE_ISOLATION=user), end to end: the real CLI, the mock Bridge.

The kernel keeps it out of `.os/`; the server ends it, and everything it started, at shutdown, at an
idle timeout, and when the server is killed with -9. (The many ways of attacking `.os/` are in the
red-team suite; here, the machinery.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest

from sprite_os.config import Settings
from sprite_os.dev.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os.isolation import AgentUser
from sprite_os.server import SpriteOS
from tests.conftest import (
    TOKEN,
    Connect,
    ServerProcess,
    client_factory,
    processes_of,
    running,
    wait_for,
)

pytestmark = pytest.mark.e2e


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def in_namespace(ns: str) -> list[int]:
    """Live processes in the pid namespace `ns` (as /proc/<pid>/ns/pid names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_namespace(int(entry.name)) == ns:
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def agent_namespace(uid: int, workspace: Path) -> str:
    """The pid namespace of the agent's processes working in `workspace` (other tests may run agents too)."""
    for pid in processes_of(uid):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(workspace)) and (ns := pid_namespace(pid)) is not None:
            return ns
    raise AssertionError(f"no process of uid {uid} works in {workspace}")


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
