"""Memory end to end: real CLI hooks, the daemon, the curator through the mock Bridge, the next session."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from pathlib import Path

import pytest

from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from devkit.processes import workspace_clis
from sprite_os.commands.main import main as cli
from sprite_os.config import Settings
from sprite_os.memory.curation import daemon as daemon_module
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.server import SpriteOS
from tests.conftest import (
    Client,
    ServerProcess,
    child_cli_processes,
    client_factory,
    make_settings,
    pid_alive,
    running,
    wait_for,
)

pytestmark = pytest.mark.e2e


def counts(settings: Settings) -> dict[str, int]:
    db = TranscriptDB(settings.layout.transcript_db)
    try:
        return db.counts()
    finally:
        db.close()


def learnings(settings: Settings) -> list[tuple[str, str, int | None]]:
    db = MemoryDB(settings.layout.memory_db)
    try:
        return [(x.type, x.content, x.source_observation_id) for x in db.all_learnings()]
    finally:
        db.close()


def observations(settings: Settings) -> list:  # type: ignore[type-arg]
    db = TranscriptDB(settings.layout.transcript_db)
    try:
        return list(db.iter_all())
    finally:
        db.close()


def sessions(settings: Settings) -> list[tuple[int, int, int]]:
    db = TranscriptDB(settings.layout.transcript_db)
    try:
        return db.conn.execute("SELECT ended_at IS NOT NULL, message_count, observation_count FROM sessions "
                               "ORDER BY started_at").fetchall()
    finally:
        db.close()


def batches(settings: Settings) -> list[tuple[str, str, list[int]]]:
    db = MemoryDB(settings.layout.memory_db)
    try:
        return [(b.trigger, b.status, b.observation_ids) for b in reversed(db.recent_batches(100))]
    finally:
        db.close()


CURATOR_LATENCY = 3.0


async def turn(c: Client, text: str) -> dict:  # type: ignore[type-arg]
    await c.send(type="user_message", text=text)
    started = await c.until("turn_started", lambda f: f["text"] == text)
    return await c.until("turn_complete", lambda f: f["turn_id"] == started["turn_id"])


# ---------------------------------------------------------------- passover, correction, search


async def test_passover_next_session_boots_knowing_and_search_finds_it(
        server: SpriteOS, bridge: MockBridge, settings: Settings) -> None:
    bridge.curator.script("FACT: The user's name is Ada Lovelace [#1]\nPREFERENCE: Likes answers in bullet points\n"
                          "USER_MD_UPDATE:\n# User\n- Name: Ada Lovelace\n- Likes bullet points\n")
    async with client_factory(server.port) as client:
        c = await client(hello={})
        await turn(c, "Hi, I'm Ada Lovelace and I like bullet points.")
        await wait_for(lambda: len(observations(settings)) == 1, timeout=60)  # the Stop hook's write is queued, not awaited
        [observation] = observations(settings)
        assert observation.processed == 0  # pending: nothing curated it yet
        assert observation.user_message == "Hi, I'm Ada Lovelace and I like bullet points."
        assert observation.agent_response.startswith("You said:")  # the Stop hook captured the final answer
        await c.send(type="new_session")  # session end triggers the batch
        await c.until("session_started")
        bridge.agent.script(Turn(ToolCall("mcp__memory__search_memory", {"query": "what is the user's name"}),
                                 Text("You are Ada.")))
        await turn(c, "Who am I?")
    first_request_of_session_2 = next(r for r in bridge.agent_requests() if r.last_user_text == "Who am I?")
    assert "- Name: Ada Lovelace" in first_request_of_session_2.system_text
    assert "Likes answers in bullet points" in first_request_of_session_2.system_text  # learned in the last 48 h
    result = next(f for f in c.frames if f["type"] == "tool_result")
    assert not result["is_error"] and "Ada Lovelace" in result["summary"] and "FACT" in result["summary"]
    await wait_for(lambda: counts(settings) == {"pending": 1, "processed": 1, "stale": 0, "total": 2}, timeout=60)
    # the first ended with new_session; the second runs on (its turn's write is queued, not awaited)
    await wait_for(lambda: sessions(settings) == [(1, 1, 1), (0, 1, 1)], timeout=60)
    assert batches(settings) == [("session-end-new_session", "done", [1])]


async def test_a_correction_reaches_the_files_within_one_batch(bridge: MockBridge, settings: Settings) -> None:
    settings = settings.with_overrides(memory_batch_turns=2)
    MemoryFiles(settings.layout).write("user.md", "# User\n- Dates: MM/DD/YYYY\n- City: Lyon\n", source="seed")
    bridge.curator.script("CORRECTION: Dates are DD/MM/YYYY, not MM/DD/YYYY [#2]\n"
                          "USER_MD_UPDATE:\n# User\n- Dates: DD/MM/YYYY\n- City: Lyon\n")
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, "Write today's date.")
        await turn(c, "No, dates should be DD/MM/YYYY.")
        await wait_for(lambda: counts(settings)["processed"] == 2, timeout=60)
    [request] = bridge.curator_requests()
    assert "- Dates: MM/DD/YYYY" in request.last_user_text and "No, dates should be DD/MM/YYYY." in request.last_user_text
    user_md = MemoryFiles(settings.layout).read("user.md")
    assert "MM/DD/YYYY" not in user_md and "- Dates: DD/MM/YYYY" in user_md
    assert learnings(settings) == [("CORRECTION", "Dates are DD/MM/YYYY, not MM/DD/YYYY", 2)]


# ---------------------------------------------------------------- compaction


async def test_auto_compaction_flushes_memory_first_and_the_fresh_files_follow(
        monkeypatch: pytest.MonkeyPatch, server: SpriteOS, bridge: MockBridge, settings: Settings) -> None:
    monkeypatch.setenv("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "20000")  # the CLI inherits our environment
    bridge.curator.script("FACT: Project codename is HERON\nCONTEXT_MD_UPDATE:\n# Now\n- Codename HERON\n")
    async with client_factory(server.port) as client:
        c = await client(hello={})
        for n in range(3):
            await turn(c, f"message {n}")
        bridge.agent.script(Turn(Text("big context now"), input_tokens=150_000))
        await turn(c, "this makes the context huge")
        assert bridge.curator_requests() == []  # 4 turns: below the batch threshold
        bridge.faults.add(Fault("latency", seconds=CURATOR_LATENCY, target="curator", times=1))
        await turn(c, "and now the CLI compacts")
    summary = next(r for r in bridge.agent_requests() if r.is_compaction)
    [curator] = bridge.curator_requests()
    # PreCompact waited for its flush: the slow curator call had finished before the compaction began
    assert summary.time - curator.time >= CURATOR_LATENCY - 0.1, summary.time - curator.time
    assert batches(settings) == [("precompact-auto", "done", [1, 2, 3, 4])]
    assert "message 0" in curator.last_user_text and "this makes the context huge" in curator.last_user_text
    after = [r for r in bridge.agent_requests() if r.time > summary.time and not r.is_compaction]
    assert after and "Codename HERON" in json.dumps(after[0].messages)  # SessionStart(compact) re-injected it
    assert counts(settings)["processed"] == 4


async def test_manual_compact_flushes_memory_first(server: SpriteOS, bridge: MockBridge,
                                                   settings: Settings) -> None:
    bridge.curator.script("FACT: The garden plan is due in May\n")
    async with client_factory(server.port) as client:
        c = await client(hello={})
        for text in ("the garden plan is due in May", "first we pick the plants", "then the soil"):
            await turn(c, text)
        bridge.faults.add(Fault("latency", seconds=CURATOR_LATENCY, target="curator", times=1))
        await c.send(type="user_message", text="/compact")
        await c.until("turn_complete", lambda f: f["turn_id"] == c.of("turn_started")[-1]["turn_id"])
    summary = next(r for r in bridge.agent_requests() if r.is_compaction)
    [curator] = bridge.curator_requests()
    assert "the garden plan is due in May" in curator.last_user_text and "then the soil" in curator.last_user_text
    # PreCompact waited for its flush: the slow curator call had finished before the compaction began
    assert summary.time - curator.time >= CURATOR_LATENCY - 0.1, summary.time - curator.time
    assert batches(settings) == [("precompact-manual", "done", [1, 2, 3])]
    assert counts(settings)["processed"] == 3


# ---------------------------------------------------------------- failures


async def test_amnesia_kill_minus_9_mid_batch_loses_and_duplicates_nothing(tmp_path: Path,
                                                                            bridge: MockBridge) -> None:
    workspace = tmp_path / "ws"
    proc = await ServerProcess(workspace, bridge.url, SPRITE_MEMORY_BATCH_TURNS="2").start()
    bridge.faults.add(Fault("latency", seconds=30, target="curator", times=1))
    async with client_factory(proc.port) as client:
        c = await client(hello={})
        await turn(c, "Research Python decorators and outline a blog post")
        await turn(c, "Use the outline: intro, closures, decorators")
        cli_pids = child_cli_processes(proc.pid)
        await bridge.wait_for(lambda b: len(b.curator_requests()) >= 1, timeout=60)
    proc.signal(signal.SIGKILL)  # mid-batch: the curator call is in flight
    await proc.wait()
    await wait_for(lambda: not any(pid_alive(p) for p in cli_pids), timeout=10)  # the CLI died with its parent
    reply = ("FACT: Blog post outline is intro, closures, decorators [#2]\n"
             "CONTEXT_MD_UPDATE:\n# Now\n- Writing a blog post on decorators\n- Outline: intro, closures, decorators\n")
    # The answer to every call from now on, not one scripted reply: the killed server's call, held
    # 30 s by the mock, would take a scripted one when it wakes (on a slow machine, before the
    # restarted server's call).
    bridge.curator.default = reply
    settings = Settings(workspace=workspace)
    # The restart in this process: the recovery is the start's work, and only the killed server had
    # to be a process of its own (tests/README.md, rule 5).
    async with running(make_settings(workspace, bridge.url, memory_batch_turns=2)):
        await wait_for(lambda: counts(settings)["processed"] == 2, timeout=30)
    assert counts(settings) == {"pending": 0, "processed": 2, "stale": 0, "total": 2}
    assert learnings(settings) == [("FACT", "Blog post outline is intro, closures, decorators", 2)]
    assert MemoryFiles(settings.layout).read("context.md") == reply.split("CONTEXT_MD_UPDATE:\n")[1]
    db = MemoryDB(settings.layout.memory_db)
    assert [b.status for b in db.recent_batches(10)] == ["done"]  # the killed call left no half batch


async def test_proxy_down_for_several_batches_then_every_turn_processed_once(
        monkeypatch: pytest.MonkeyPatch, bridge: MockBridge, settings: Settings) -> None:
    monkeypatch.setattr(daemon_module, "BACKOFF_FIRST", 0.1)
    monkeypatch.setattr(daemon_module, "BACKOFF_MAX", 0.3)
    settings = settings.with_overrides(memory_batch_turns=2)
    bridge.faults.add(Fault("status", status=529, target="curator", times=5))
    bridge.curator.default = "FACT: a turn happened"
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        for n in range(6):
            await turn(c, f"turn {n}")
        await wait_for(lambda: counts(settings)["processed"] == 6, timeout=30)

        async def failing_cleared() -> bool:  # the batch's commit shows before the daemon clears its clock
            return (await app.health())["memory"]["consecutive_failures"] == 0

        await wait_for(failing_cleared, timeout=30)
        health = await app.health()
    db = MemoryDB(settings.layout.memory_db)
    batches = db.recent_batches(100)
    done = sorted(i for b in batches if b.status == "done" for i in b.observation_ids)
    assert done == [1, 2, 3, 4, 5, 6]
    assert sum(b.status == "failed" for b in batches) == 5
    assert health["memory"]["last_error"] and not health["memory"]["degraded"]


async def test_a_persons_edit_during_a_batch_survives(bridge: MockBridge, settings: Settings) -> None:
    files = MemoryFiles(settings.layout)
    settings = settings.with_overrides(memory_batch_turns=1)
    files.write("user.md", "# User\n", source="seed")
    bridge.faults.add(Fault("latency", seconds=1.0, target="curator", times=1))
    bridge.curator.script("FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n")  # made before the edit
    bridge.curator.script("FACT: Name is Ada\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n- Title: Countess\n")
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, "I'm Ada")
        await bridge.wait_for(lambda b: len(b.curator_requests()) >= 1)
        files.path("user.md").write_text("# User\n- Title: Countess (added by hand)\n")
        await wait_for(lambda: counts(settings)["processed"] == 1, timeout=60)
    second = bridge.curator_requests()[1]
    assert "added by hand" in second.last_user_text  # the batch ran again, on the edited file
    assert "- Title: Countess" in files.read("user.md")
    sources = [v.source for v in files.history("user.md")][-2:]
    assert sources[0] == "on-disk" and sources[1].startswith("batch-")  # the edit is a version


# ---------------------------------------------------------------- zero write paths


async def test_the_agent_cannot_write_memory_by_write_or_bash(agent_server: SpriteOS, bridge: MockBridge,
                                                              agent_settings: Settings) -> None:
    """As a deployed Sprite runs it (the CLI as its own user): the kernel refuses every write
    (tests/test_isolation_redteam_e2e.py tries 89 more ways; tests/test_guard.py the guard's reason)."""
    settings = agent_settings
    files = MemoryFiles(settings.layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="seed")
    before = hashlib.sha256(files.path("user.md").read_bytes()).hexdigest()
    bridge.agent.script(Turn(
        ToolCall("Write", {"file_path": ".os/memory/user.md", "content": "# User\n- Name: Mallory\n"}),
        ToolCall("Bash", {"command": "echo '- Name: Mallory' >> .os/memory/user.md"}),
        ToolCall("Bash", {"command": f"cd {settings.layout.memory_dir} && sed -i s/Ada/Mallory/ user.md"}),
        Text("I tried.")))
    async with client_factory(agent_server.port) as client:
        c = await client(hello={})
        await turn(c, "rewrite your memory")
        [pid] = workspace_clis(settings.layout.root)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    results = c.of("tool_result")
    assert len(results) == 3 and all(r["is_error"] for r in results), results
    # The CLI looks at the file before the guard is asked, and the kernel refuses it that look. The
    # CLI's own check refuses these two shell writes before they run; the red-team suite smuggles
    # such writes past it to show the kernel refusing them.
    assert "permission denied" in results[0]["summary"].lower(), results[0]["summary"]
    assert hashlib.sha256(files.path("user.md").read_bytes()).hexdigest() == before
    assert b"CLAUDE_CODE_DISABLE_AUTO_MEMORY=1" in environ  # the CLI's own memory is off
    tools = bridge.agent_requests()[0].tools
    assert [t for t in tools if "memory" in t.lower()] == ["mcp__memory__search_memory"]


# ---------------------------------------------------------------- operator commands


async def test_rebuild_reproduces_the_learnings_from_the_transcript(
        bridge: MockBridge, settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings.with_overrides(memory_batch_turns=2)
    replies = ["FACT: Has a cat named Miso [#1]\nUSER_MD_UPDATE:\n# User\n- Cat: Miso\n",
               "PREFERENCE: Tea, not coffee [#4]\nACTION: Buy tea on Friday [#3]\n"]
    for reply in replies:
        bridge.curator.script(reply)
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        for n, text in enumerate(("I have a cat named Miso", "she is grey", "remind me to buy tea Friday",
                                  "I prefer tea"), start=1):
            await turn(c, text)
            if n % 2 == 0:  # each batch of two is curated before the next turns: the groups are fixed
                await wait_for(lambda n=n: counts(settings)["processed"] == n, timeout=60)
        assert cli(["memory", "rebuild", "--yes"]) == 2  # refused while the server holds the writer lock
    original = learnings(settings)
    assert len(original) == 3
    for reply in replies:
        bridge.curator.script(reply)
    import os

    os.environ["SPRITE_WORKSPACE"] = str(settings.workspace)
    os.environ["ANTHROPIC_BASE_URL"] = bridge.url
    live = len(bridge.curator_requests())
    assert live == 2
    try:
        assert await asyncio.to_thread(cli, ["memory", "rebuild", "--yes"]) == 0
        assert learnings(settings) == original
        # The rebuild curated the original turns again, in the same groups, from wiped files.
        first, second = bridge.curator_requests()[live:]
        assert "I have a cat named Miso" in first.last_user_text and "she is grey" in first.last_user_text
        assert "remind me to buy tea Friday" not in first.last_user_text
        assert "remind me to buy tea Friday" in second.last_user_text and "I prefer tea" in second.last_user_text
        assert "- Cat: Miso" not in first.last_user_text  # not the curated user.md: the wiped one
        assert "===== user.md (curated, at most" in first.last_user_text
        assert first.last_user_text.split("===== user.md")[1].split("=====\n")[1].startswith("(empty)")
        assert "- Cat: Miso" in second.last_user_text  # ...which the rebuild's first batch then wrote
        assert MemoryFiles(settings.layout).read("user.md") == "# User\n- Cat: Miso\n"
        capsys.readouterr()
        assert cli(["memory", "status"]) == 0
        status = capsys.readouterr().out
        assert "4 processed, 0 pending, 0 stale" in status and "learnings        3" in status
        assert cli(["memory", "search", "what is the cat called"]) == 0
        assert "Has a cat named Miso" in capsys.readouterr().out
        assert cli(["memory", "history", "user.md"]) == 0
        history = capsys.readouterr().out
        assert "rebuild-batch-1" in history and "batch-1" in history
        first = history.split()[0]
        assert cli(["memory", "rollback", "user.md", first]) == 0
        assert cli(["memory", "rollback", "user.md", "999"]) == 2
        assert cli(["memory", "history", "secrets.md"]) == 2
    finally:
        del os.environ["SPRITE_WORKSPACE"], os.environ["ANTHROPIC_BASE_URL"]
    assert len(list(settings.layout.memory_dir.glob("memory.db.before-rebuild-*"))) == 1


async def test_rebuild_streams_the_transcript_in_batches(bridge: MockBridge, settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os.memory.curation.rebuild import rebuild
    from sprite_os.memory.transcript_store import NewObservation

    db = TranscriptDB(settings.layout.transcript_db)
    for n in range(1, 8):
        db.append(NewObservation(float(n), "s1", n, f"turn {n}", "[]", "ok"))
    db.close()
    asked: list[int] = []
    original = TranscriptDB.pending
    monkeypatch.setattr(TranscriptDB, "pending", lambda self, limit=10_000, leaving_out=(): asked.append(limit)
                        or original(self, limit, leaving_out))
    report = await rebuild(settings.with_overrides(memory_batch_turns=3))
    assert (report.observations, report.batches) == (7, 3)  # 3 + 3 + 1 turns
    assert asked and max(asked) == 3  # never the whole transcript at once
    assert counts(settings)["processed"] == 7
