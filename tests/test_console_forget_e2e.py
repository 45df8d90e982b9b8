"""Forget means gone, in a real Chromium through the real CLI: a person forgets a turn of a past
session, and its words leave the conversation on every device, the agent's search_memory,
auto-recall, the boot prompt, the memory files and their history (a line the curator reworded
too, an unrelated one stays), and the raw bytes of both databases; forgetting a learning offers to forget the turn it came from; forgetting a turn of
the current session restarts it. Real server, real CLI, the mock Bridge as model and curator."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from playwright.async_api import Locator, expect

from devkit.mock_bridge import MockBridge
from sprite_os.config import Settings
from sprite_os.memory.forget.jobs import jobs
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.server import SpriteOS
from tests.conftest import wait_for
from tests.console_browser import (
    Tab,
    chromium,
    install_templates,
    open_tab,
    screenshot,
    screenshot_dir,
)

pytestmark = pytest.mark.e2e

WORDS = ("lisbon", "alfama")
CURATED = ("FACT: The user's name is Ada [#1]\nFACT: The user lives in Lisbon, in Alfama [#2]\n"
           "SUMMARY: Ada said who she is and where she lives [#2]\n"
           "USER_MD_UPDATE:\n# User\n- Name: Ada\n- Lives in: Lisbon (Alfama)\n"
           "- Home: the Alfama district, in Portugal's capital city\n"  # reworded: few of the turn's words
           "- Visiting Porto in May for a conference\n")  # of no turn forgotten here: it stays


def raw(settings: Settings) -> dict[str, list[str]]:
    """Which of WORDS each database file (and its WAL) holds, byte for byte."""
    out = {}
    for db in (settings.layout.transcript_db, settings.layout.memory_db):
        data = b""
        for path in (db, Path(f"{db}-wal")):
            with contextlib.suppress(FileNotFoundError):
                data += path.read_bytes()
        out[db.name] = [w for w in WORDS if w.encode() in data.lower()]
    return out


def processed(settings: Settings) -> int:
    db = TranscriptDB(settings.layout.transcript_db)
    try:
        return db.counts()["processed"]
    finally:
        db.close()


async def say(tab: Tab, text: str) -> Locator:
    """Sends `text` and waits for its turn's line (with its Forget), which comes with turn_complete,
    after the answer shows as complete: the chat's last line until then is the turn before's."""
    await tab.send(text)
    answer = tab.messages("assistant").last
    await expect(answer).to_contain_text(text)
    turn_id = await answer.get_attribute("data-turn-id")
    status = tab.page.locator(f'[data-testid="turn-status"][data-turn-id="{turn_id}"]')
    await expect(status).to_have_count(1)
    return status


async def test_forget_a_turn_then_search_recall_the_boot_prompt_and_the_bytes_are_without_it(
        server: SpriteOS, bridge: MockBridge, settings: Settings, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    install_templates(settings)
    bridge.curator.script(CURATED)
    memory = server.memory
    assert memory is not None
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await say(tab, "My name is Ada")
        await say(tab, "I live in Lisbon, in Alfama")
        await tab.by("new-session").click()  # the session's end curates it
        await wait_for(lambda: processed(settings) == 2, timeout=60, what="the batch")
        assert "Lisbon" in memory.files.read("user.md")
        assert raw(settings) == {"transcript.db": list(WORDS), "memory.db": list(WORDS)}  # before: the words are there

        other = await open_tab(browser, tab.base)  # a second device, showing the same past session
        await other.sign_in()
        await other.connected()
        for t in (tab, other):
            await t.by("past-sessions").click()
            await t.by("past-session").filter(has_text="My name is Ada").get_by_role("button").click()
            await expect(t.by("past-turns").locator('[data-role="user"]')).to_have_count(2)
        lisbon = tab.by("past-turns").locator('[data-turn="2"][data-testid="turn-status"]')
        await lisbon.get_by_test_id("forget-turn").click()
        await expect(lisbon).to_contain_text("this can't be undone")
        await screenshot(tab, shots, "forget-confirm-light")
        await tab.page.keyboard.press("Enter")  # the confirm button has the focus
        for t in (tab, other):  # gone on every device, a tombstone where it was
            await expect(t.by("past-turns").get_by_test_id("tombstone")).to_have_count(1)
            await expect(t.by("past-turns")).not_to_contain_text("Lisbon")
        await expect(tab.by("past-status")).to_contain_text("Forgotten: 1 turn")

        # search, auto-recall and the boot prompt at once
        for hit in await memory.search("Lisbon Alfama", 10):
            assert not any(w in hit.snippet.lower() for w in WORDS), hit
        recalled = await memory.recall_for("Do you remember Lisbon and Alfama?", "another", "t-1")
        assert recalled is None or not any(w in recalled.context.lower() for w in WORDS)
        await tab.by("past-close").first.click()
        await tab.memory("boot")
        await expect(tab.by("boot-prompt")).to_contain_text("- Name: Ada")
        await expect(tab.by("boot-prompt")).not_to_contain_text("Lisbon")
        # the daemon's pass: the files, their history; the raw bytes of both databases and their WALs
        await wait_for(lambda: memory.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
        assert memory.files.read("user.md") == "# User\n- Name: Ada\n- Visiting Porto in May for a conference\n"
        for version in memory.files.history("user.md"):
            assert not any(w in version.text.lower() for w in WORDS), version.text
        assert any("text removed here" in v.text for v in memory.files.history("user.md"))
        await wait_for(lambda: raw(settings) == {"transcript.db": [], "memory.db": []}, timeout=30,
                       what=f"no word left on disk: {raw(settings)}")
        # the agent's own search_memory, through the real CLI (this turn's words are recorded, of course)
        await tab.by("chat-tab").click()
        await tab.send("search: Alfama")
        reply = tab.messages("assistant").last
        await expect(reply).to_contain_text('Memory search for "Alfama" returned')
        found = (await reply.inner_text()).split("returned", 1)[1].lower()
        assert not any(w in found for w in WORDS), found

        # forgetting a learning offers to forget the turn it came from
        await tab.memory("learnings")
        await tab.by("learning-search").fill("Ada")
        await tab.by("learning-search-button").click()
        await expect(tab.by("memory-panel-learnings")).to_contain_text("found for “Ada”")
        name = tab.by("learning").filter(has_text="The user's name is Ada")
        await name.get_by_test_id("learning-forget").click()
        await expect(name).to_have_attribute("data-forgotten", "true")
        await expect(name.get_by_test_id("learning-offer")).to_contain_text("turn 1 of session")
        await name.get_by_test_id("forget-turn").click()
        await name.get_by_test_id("forget-confirm").click()
        await expect(tab.by("memory-flash")).to_contain_text("Forgotten for good")
        hits = await memory.search("Ada", 10)  # neither the turn nor what was learned from it
        assert not [h for h in hits if h.kind == "episode" and h.observation_id == 1], hits
        assert not [h for h in hits if h.kind == "learning" and "name is ada" in h.snippet.lower()], hits

        # a turn of the current session, from the chat: the session restarts, so the agent lets go of it
        await tab.by("chat-tab").click()
        status = await say(tab, "My locker code is Gazpacho")
        await status.get_by_test_id("forget-turn").click()
        await status.get_by_test_id("forget-confirm").click()
        await expect(tab.page.locator('[data-kind="forgotten-done"]')).to_contain_text("The session was restarted")
        await expect(tab.by("messages")).not_to_contain_text("Gazpacho")
        await expect(other.by("messages")).not_to_contain_text("Gazpacho")
        await expect(tab.page.locator('[data-kind="session"]').last).to_contain_text("A new session started")
        await expect(tab.page.locator('[data-kind="session"]').filter(has_text="The session ended").last).to_contain_text(
            "a turn of it was forgotten")
        assert not [h for h in await memory.search("Gazpacho", 10) if "gazpacho" in h.snippet.lower()]
        tab.assert_clean()
        other.assert_clean()
