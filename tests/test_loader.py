"""The boot prompt: six files, pending actions, recent learnings and the turns not yet curated, each
capped, plain text, never a crash."""

import json
from pathlib import Path

import msgspec

from sprite_os.db_worker import Worker
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.loader import TURNS_CHARS, BootLoader, assemble, cap
from sprite_os.memory.memory_store import Learning, MemoryDB, PendingAction
from sprite_os.memory.transcript_store import NewObservation
from sprite_os.paths import Layout


def test_everything_is_in_the_prompt_in_order() -> None:
    files = {"soul.md": "I am Sprite.", "os.md": "Rules here.", "tools.md": "- can OCR", "files.md": "- docs/",
             "user.md": "- Name: Ada", "context.md": "- Tax return due"}
    actions = [PendingAction(1, 1.0, "Remind Ada about the tax return", 0, "pending", None)]
    recent = [Learning(1, 1_790_000_000.0, "s", "PREFERENCE", "Dates as DD/MM/YYYY", 1, 0.9)]
    prompt = assemble(files, actions, recent)
    order = [prompt.index(s) for s in ("I am Sprite.", "Rules here.", "- can OCR", "- docs/", "- Name: Ada",
                                       "- Tax return due", "Remind Ada", "PREFERENCE: Dates as DD/MM/YYYY")]
    assert order == sorted(order)
    assert "search_memory" in prompt and "never need to save" in prompt


def test_missing_and_empty_files_get_defaults() -> None:
    prompt = assemble({"user.md": "   \n"}, [], [])
    assert "You are a helpful, careful assistant." in prompt  # soul.md default
    assert prompt.count("Nothing recorded yet.") == 4
    assert "Pending actions" not in prompt and "Learned in the last" not in prompt


def test_files_are_cut_to_their_limits_and_the_cut_is_said() -> None:
    capped = cap("tools.md", "\n".join(f"line {n}" for n in range(400)))
    assert capped.text.count("\n") == 149
    assert capped.note is not None and "150 of 400 lines" in capped.note
    wide = cap("user.md", "x" * 100_000)
    assert len(wide.text.encode()) <= 24_000 and wide.note is not None
    assert cap("user.md", "short").note is None


def turn(n: int, text: str = "", calls: str = "[]") -> NewObservation:
    return NewObservation(timestamp=1_790_000_000.0 + n * 60, session_id="s", sequence_num=n,
                          user_message=f"message {n} {text}", tool_calls_json=calls, agent_response=f"answer {n}")


def test_turns_not_yet_curated_follow_the_memory_newest_kept_first_shown_oldest_first() -> None:
    calls = json.dumps([{"name": "WebFetch", "input": '{"url": "https://x"}', "output": "page", "is_error": False}])
    jumped = msgspec.structs.replace(turn(3, "(the server stopped before the turn ended)"), timestamp=0.0)
    prompt = assemble({}, [], [], turns=[turn(1), turn(2, calls=calls), jumped])  # the clock went back before 3
    section = prompt[prompt.index("## Recent turns not yet in your memory"):]
    assert section.index("message 1") < section.index("message 2") < section.index("message 3")  # as recorded
    assert 'TOOL WebFetch {"url": "https://x"} -> ok: page' in section
    assert "pick it up where it stopped" in section
    many = assemble({}, [], [], turns=[turn(n, "x" * 1_400) for n in range(1, 60)])
    kept = many[many.index("## Recent turns"):]
    assert "message 59" in kept and "message 1 " not in kept and "older ones are left out" in kept
    assert len(kept) < TURNS_CHARS + 2_000
    assert "Recent turns" not in assemble({}, [], [], turns=[])


def test_the_prompt_is_plain_text_whatever_the_files_and_learnings_hold() -> None:
    recent = [Learning(1, 1_790_000_000.0, "s", "FACT", "nul\x00here \ud83d", 1, 0.8)]
    prompt = assemble({"user.md": "- Name: Ada\x00Lovelace\r\n- bell\x07\r\n"}, [], recent, turns=[turn(1, "esc\x1b[31m")])
    assert "- Name: AdaLovelace\n- bell\n" in prompt and "FACT: nulhere \ufffd" in prompt and "esc[31m" in prompt
    assert not [c for c in prompt if ord(c) < 32 and c not in "\t\n"]


async def test_a_broken_memory_db_or_transcript_never_stops_a_boot(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    layout.memory_db.write_bytes(b"this is not a database" * 100)

    async def broken_turns(_limit: int) -> list[NewObservation]:
        raise OSError("transcript.db unreadable")

    memory: Worker[MemoryDB] = Worker("m", lambda: MemoryDB(layout.memory_db))
    try:
        prompt = await BootLoader(MemoryFiles(layout), memory, broken_turns).boot_prompt()
    finally:
        await memory.close()
    assert "You are a helpful, careful assistant." in prompt and "# Your memory" in prompt
