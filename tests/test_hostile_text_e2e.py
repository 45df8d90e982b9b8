"""Hostile text never stops a session: a NUL, any C0 control or a lone surrogate in a
curator reply or in a person's edit on disk, and a boot prompt at its maximum size, through the
real CLI."""

from __future__ import annotations

import time

import pytest
from structlog.testing import capture_logs

from devkit.mock_bridge import MockBridge
from sprite_os.config import Settings
from sprite_os.memory.curation.reply import MAX_LEARNING_CHARS
from sprite_os.memory.files import MAX_FILE_BYTES, SPECS, MemoryFiles
from sprite_os.memory.loader import MAX_ACTIONS, MAX_RECENT
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from tests.conftest import client_factory, running, wait_for
from tests.test_memory_e2e import counts, learnings, turn

pytestmark = pytest.mark.e2e

# Every C0 control but tab and newline, and CR, which becomes a newline (the tests' line ends use it).
CONTROLS = "".join(chr(c) for c in range(32) if chr(c) not in "\t\n\r")


async def told_then_asked(settings: Settings, told: str, asked: str) -> dict:  # type: ignore[type-arg]
    """A turn, then a new session (the first one's end curates the turn), and a question in it."""
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, told)
        await c.send(type="new_session")
        await c.until("session_started")
        await wait_for(lambda: counts(settings)["processed"] == 1, timeout=20)
        return await turn(c, asked)


def assert_plain(text: str) -> None:
    assert not [c for c in text if ord(c) < 32 and c not in "\t\n"], "a control character got through"
    text.encode("utf-8")  # no lone surrogate either


async def test_a_nul_in_a_curator_reply_does_not_stop_the_next_session(bridge: MockBridge, settings: Settings) -> None:
    """As it was found: the curator writes a NUL into user.md, then the next session starts."""
    bridge.curator.script("USER_MD_UPDATE:\n# User\n- Name: Ada\x00Lovelace\n")
    done = await told_then_asked(settings, "I'm Ada Lovelace.", "Who am I?")
    assert done["status"] == "completed"
    user_md = MemoryFiles(settings.layout).read("user.md")
    assert user_md == "# User\n- Name: AdaLovelace\n"
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "Who am I?")
    assert "- Name: AdaLovelace" in request.system_text
    assert_plain(request.system_text)


async def test_a_lone_surrogate_in_a_reply_is_curated_not_a_failed_batch(bridge: MockBridge, settings: Settings) -> None:
    # The mock encodes it as the JSON escape "\ud83d", which is what a model cut mid-emoji sends.
    bridge.curator.script("FACT: Ada's favourite emoji is \ud83d\nUSER_MD_UPDATE:\n# User\n- Emoji: \ud83d\n")
    done = await told_then_asked(settings, "My favourite emoji is the cat.", "What's my emoji?")
    assert done["status"] == "completed"
    assert learnings(settings) == [("FACT", "Ada's favourite emoji is \ufffd", 1)]
    assert MemoryFiles(settings.layout).read("user.md") == "# User\n- Emoji: \ufffd\n"
    db = MemoryDB(settings.layout.memory_db)
    assert {b.status for b in db.recent_batches(10)} == {"done"}  # no failed call before it
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "What's my emoji?")
    assert "- Emoji: \ufffd" in request.system_text


async def test_every_c0_control_from_the_curator_or_a_hand_edit_is_taken_out(
        bridge: MockBridge, settings: Settings) -> None:
    files = MemoryFiles(settings.layout)
    settings.layout.ensure()
    # A person's edit on disk, which no writer saw: CR LF line ends, and every control character.
    (settings.layout.memory_dir / "files.md").write_bytes(
        b"# Files\r\n- taxes/ " + CONTROLS.encode() + b" 2025\r\n- invalid \xff byte\r\n")
    bridge.curator.script(f"FACT: Ada likes {CONTROLS}tea\nCONTEXT_MD_UPDATE:\n# Now\n- Plan {CONTROLS}the trip\r\n")
    done = await told_then_asked(settings, "Plan the trip, and remember I like tea.", "What's the plan?")
    assert done["status"] == "completed"
    assert files.read("context.md") == "# Now\n- Plan the trip\n"
    assert learnings(settings) == [("FACT", "Ada likes tea", 1)]
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "What's the plan?")
    assert_plain(request.system_text)
    assert "- taxes/  2025\n- invalid \ufffd byte" in request.system_text and "- Plan the trip" in request.system_text
    assert "FACT: Ada likes tea" in request.system_text


def fill_to_the_limits(settings: Settings) -> dict[str, str]:
    """Every memory file at its line limit and byte cap, the 48 hours' learnings at their cap (as
    many as the boot prompt lists, each as long as the curator keeps), and the pending actions."""
    files = MemoryFiles(settings.layout)
    settings.layout.ensure()
    texts = {}
    for name, spec in SPECS.items():
        width = MAX_FILE_BYTES // spec.max_lines - 1  # the newline
        lines = [f"{name} line {n:03d} ".ljust(width, "x") for n in range(spec.max_lines)]
        texts[name] = "\n".join(lines) + "\n"
        assert len(texts[name].encode()) <= MAX_FILE_BYTES and texts[name].count("\n") == spec.max_lines
        files.write(name, texts[name], source="seed")
    items = [NewLearning("ACTION" if n < MAX_ACTIONS else "FACT", f"learning {n:02d} ".ljust(MAX_LEARNING_CHARS, "y"))
             for n in range(MAX_RECENT)]
    db = MemoryDB(settings.layout.memory_db)
    batch = db.commit_batch(trigger="seed", observation_ids=[], model="m", input_tokens=0, output_tokens=0,
                            cost_usd=0.0, learnings=items, file_updates={}, base_hashes={})
    db.set_batch_status(batch.id, "done")
    db.close()
    return texts


async def test_a_session_starts_with_every_file_at_its_limit_and_48_hours_of_learnings_at_their_cap(
        bridge: MockBridge, settings: Settings) -> None:
    texts = fill_to_the_limits(settings)
    with capture_logs() as logs:
        async with running(settings) as app, client_factory(app.port) as client:
            c = await client(hello={})
            started = time.monotonic()
            done = await turn(c, "Hello at the maximum size.")
            seconds = time.monotonic() - started
    failed = [e for e in logs if e["event"] == "turn_failed"]
    # The boot prompt goes to the CLI in a file (isolation/launch.py): as one argument, Linux would cap it
    # at 128 KiB (MAX_ARG_STRLEN), and this start would fail with "Argument list too long".
    assert done["status"] == "completed", failed
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "Hello at the maximum size.")
    prompt = request.system_text
    for name, text in texts.items():
        assert text.splitlines()[-1] in prompt, f"{name} was cut"
    assert f"learning {MAX_RECENT - 1:02d}" in prompt and "learning 00" in prompt
    assert len(prompt.encode()) > 128 * 1024  # more than one argument may hold
    assert seconds < 30
