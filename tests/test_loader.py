"""The boot prompt: six files, pending actions and recent learnings, each capped, never a crash."""

from sprite_os.memory.loader import assemble, cap
from sprite_os.memory.memory_store import Learning, PendingAction


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
