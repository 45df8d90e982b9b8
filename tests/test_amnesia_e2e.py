"""The design's Amnesia and Correction tests through the real CLI, and no CLI left behind by a server
killed with -9."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from devkit.processes import workspace_clis
from sprite_os.agent.ledger import CliLedger, descendants
from sprite_os.config import Settings
from sprite_os.memory.capture.journal import STOPPED_NOTE, journal_path
from sprite_os.paths import Layout
from sprite_os.procfs import cmdline
from tests.conftest import (
    ServerProcess,
    child_cli_processes,
    client_factory,
    make_settings,
    pid_alive,
    running,
    wait_for,
)
from tests.test_memory_e2e import counts, learnings, observations, turn

pytestmark = pytest.mark.e2e

TASK = "Research Python decorators and outline a blog post"
RESEARCH = "decorators wrap functions; functools.wraps keeps the name"


async def test_amnesia_kill_9_mid_turn_then_continue_picks_the_task_up(tmp_path: Path, bridge: MockBridge) -> None:
    """Amnesia: start a task, kill -9 the server mid-turn, restart, say "Continue": the new
    session's request holds the task and what was done of it, before any curator call."""
    workspace = tmp_path / "ws"
    bridge.agent.script(Turn(ToolCall("Bash", {"command": f"echo '{RESEARCH}'", "description": "research"}),
                             Text("The research is done. The outline: " + "point " * 400, chunk_delay=0.05)))
    proc = await ServerProcess(workspace, bridge.url).start()
    try:
        async with client_factory(proc.port) as client:
            c = await client(hello={})
            await c.send(type="user_message", text=TASK)
            assert RESEARCH in (await c.until("tool_result"))["summary"]
            await c.until("text_delta")  # the research step is done; the outline is being written
            journal = journal_path(Layout(workspace))
            await wait_for(lambda: journal.exists() and b"functools.wraps" in journal.read_bytes(), timeout=10,
                           what="the open turn, research included, on disk")
    finally:  # the kill is the scenario; in a finally, a failing step does not leave the server running
        proc.signal(signal.SIGKILL)
        await proc.wait()
    bridge.faults.add(Fault("status", status=529, target="curator"))  # no curator call succeeds after the crash
    # The restart in this process: what it recovers is the start's work; only the killed server had to
    # be a process of its own (tests/README.md, rule 5).
    async with running(make_settings(workspace, bridge.url)) as app, client_factory(app.port) as client:
        c = await client(hello={})
        done = await turn(c, "Continue")
    assert done["status"] == "completed"
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "Continue")
    prompt = request.system_text
    section = prompt[prompt.index("## Recent turns not yet in your memory"):]
    assert f"USER: {TASK}" in section
    assert "TOOL Bash" in section and "functools.wraps" in section  # what was done of it
    assert STOPPED_NOTE in section  # and that it was cut short
    assert not any(r.status == 200 for r in bridge.curator_requests())  # before any curator call
    settings = Settings(workspace=workspace)
    recorded = observations(settings)
    assert [o.user_message for o in recorded] == [TASK, "Continue"]  # the interrupted turn, once
    assert recorded[0].agent_response.endswith(STOPPED_NOTE) and "functools.wraps" in recorded[0].tool_calls_json
    assert counts(settings)["pending"] == 2  # still waiting for the curator, and nothing lost meanwhile
    assert not journal_path(settings.layout).exists()


async def test_correction_a_fact_corrected_midway_is_recalled_right_after_50_turns(
        bridge: MockBridge, settings: Settings) -> None:
    """Correction: a fact, 50+ turns with a correction in between, then the question in a fresh
    session. The curator is scripted as the design's rules ask: the correction is a CORRECTION
    learning and rewrites user.md."""
    settings = settings.with_overrides(memory_batch_turns=10)

    def curate(request: object) -> str:
        text = getattr(request, "last_user_text", "")
        if "my dog is called Max, not Rex" in text:
            return "CORRECTION: The user's dog is called Max, not Rex\nUSER_MD_UPDATE:\n# User\n- Dog: Max\n"
        if "My dog is called Rex" in text:
            return "FACT: The user's dog is called Rex\nUSER_MD_UPDATE:\n# User\n- Dog: Rex\n"
        return "NONE"

    bridge.curator.default = curate
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, "My dog is called Rex.")
        for n in range(2, 31):
            await turn(c, f"Small talk {n}: what's a good name for a tortoise?")
        await turn(c, "Sorry, I was wrong: my dog is called Max, not Rex.")
        for n in range(32, 56):
            await turn(c, f"Small talk {n}: and for a cat?")
        await c.send(type="new_session")  # a fresh context: only memory can answer now
        await c.until("session_started")
        done = await turn(c, "What is my dog called?")
    assert done["status"] == "completed"
    assert counts(settings)["processed"] == 56
    assert [(kind, text) for kind, text, _ in learnings(settings)] == [
        ("FACT", "The user's dog is called Rex"), ("CORRECTION", "The user's dog is called Max, not Rex")]
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "What is my dog called?")
    prompt = request.system_text
    user_md = prompt[prompt.index("(user.md)"):prompt.index("(context.md)")]
    assert "- Dog: Max" in user_md and "Rex" not in user_md
    assert "- Dog: Rex" not in prompt  # the old statement is in no file
    learned = prompt[prompt.index("## Learned in the last"):]
    # The fact a correction replaces leaves the recent learnings; the correction keeps where it came
    # from ("was: ... until <date>"), and the list says a correction overrides what it contradicts.
    assert "FACT: The user's dog is called Rex" not in learned
    line = next(x for x in learned.splitlines() if "CORRECTION: The user's dog is called Max" in x)
    assert "(was: The user's dog is called Rex until " in line
    assert "a CORRECTION overrides any older learning it contradicts" in learned
    # Not in this session's conversation, except as a memory auto-recall brought back, before the
    # correction that overrides it.
    last_user = next(m for m in reversed(request.messages) if m["role"] == "user")
    texts = [b["text"] for b in last_user["content"] if isinstance(b, dict) and b.get("type") == "text"]
    recalled = "".join(t for t in texts if t.startswith("<recalled-memories>"))
    assert "My dog is called Rex" not in json.dumps(request.messages).replace(json.dumps(recalled)[1:-1], "")
    if "My dog is called Rex" in recalled:
        assert recalled.index("My dog is called Rex") < recalled.index("my dog is called Max, not Rex")


# ---------------------------------------------------------------- no orphans


async def test_kill_9_of_the_server_alone_leaves_no_cli_and_a_restart_never_runs_two(
        tmp_path: Path, bridge: MockBridge) -> None:
    workspace = tmp_path / "ws"
    long_job = "python3 -c 'import time; time.sleep(600)'"
    bridge.agent.script(Turn(ToolCall("Bash", {"command": long_job, "description": "a long job"}), Text("done")))
    proc = await ServerProcess(workspace, bridge.url).start()
    async with client_factory(proc.port) as client:
        c = await client(hello={})
        await c.send(type="user_message", text="run the long job")
        await c.until("tool_use")
        [cli] = child_cli_processes(proc.pid)
        await wait_for(lambda: any(b"time.sleep(600)" in cmdline(p) for p in descendants(cli)), timeout=15,
                       what="the tool running")
        tree = descendants(cli)
        ledger = CliLedger.for_workspace(workspace).path
        assert json.loads(ledger.read_text())[0]["pid"] == cli  # recorded while it runs
    proc.signal(signal.SIGKILL)
    await proc.wait()
    # The CLI waits on its tool, and the tool runs on: what a kill -9 leaves (seen in a real run).
    assert [p for p in tree if pid_alive(p)], "the tool died with the server: nothing left to end"
    # The restart in this process, as in the Amnesia test above: its CLI is a child of this process.
    async with running(make_settings(workspace, bridge.url)) as app:
        assert not [p for p in [cli, *tree] if pid_alive(p)]  # ended before the restart answered
        async with client_factory(app.port) as client:
            c = await client(hello={})
            assert (await turn(c, "hello again"))["status"] == "completed"
            # Only this server's: every CLI in the workspace is a child of this process (which may
            # have others, elsewhere).
            assert workspace_clis(workspace) != [] and set(workspace_clis(workspace)) <= set(child_cli_processes())
    assert workspace_clis(workspace) == [] and not ledger.exists()
