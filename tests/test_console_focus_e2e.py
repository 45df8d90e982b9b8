"""The page redrawn under a person working it by keyboard or screen reader never throws their focus
to the page's body. The agent updates a card (any card) every few seconds while it works: the focus
stays on the button of the card they were on, and in the dialog of a card they opened. A memory
file's Edit puts them in the editor, and Cancel, Save or a rollback back on Edit; a folder drawn
again keeps it on the file's button; a Forget puts it on what replaced the thing forgotten. Real
Chromium, real server and CLI; the cards change through the canvas store the agent's tools use."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.async_api import expect

from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.server import SpriteOS
from sprite_os.tools.canvas import CreateCard, UpdateCard
from tests.console_browser import Tab, chromium, install_templates, open_tab, signed_in

pytestmark = pytest.mark.e2e


async def focused(tab: Tab) -> str:
    """Which card's which control has the focus: 'a:card-copy', 'dialog:card-dialog-close', or the tag."""
    return str(await tab.page.evaluate("""() => {
        const at = document.activeElement;
        const where = at.closest("dialog") ? "dialog" : at.closest("[data-card-id]")?.dataset.cardId;
        return where ? `${where}:${at.dataset.testid}` : at.tagName.toLowerCase();
    }"""))


async def test_focus_stays_on_a_card_and_in_its_dialog_while_the_agent_updates_cards(server: SpriteOS) -> None:
    for card in ("a", "b"):
        await server.canvas.create(CreateCard(title=f"Card {card}", body=f"{card} one", id=card))
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        card_a = tab.page.locator('[data-card-id="a"]')
        await card_a.get_by_test_id("card-copy").focus()
        await server.canvas.update(UpdateCard(id="b", body="b two"))  # another card: it moves to the top
        await expect(tab.page.locator('[data-card-id="b"]')).to_contain_text("b two")
        assert await focused(tab) == "a:card-copy"
        await server.canvas.update(UpdateCard(id="a", body="a two"))  # the card itself: drawn again
        await expect(card_a).to_contain_text("a two")
        assert await focused(tab) == "a:card-copy"

        await card_a.get_by_test_id("card-expand").focus()
        await tab.page.keyboard.press("Enter")
        dialog = tab.by("card-dialog")
        await expect(dialog).to_contain_text("a two")
        await tab.by("card-dialog-close").focus()
        await server.canvas.update(UpdateCard(id="a", body="a three"))
        await expect(dialog).to_contain_text("a three")  # the open card is current
        assert await focused(tab) == "dialog:card-dialog-close"
        await tab.page.keyboard.press("Enter")  # the keyboard still closes it
        await expect(dialog).to_be_hidden()
        tab.assert_clean()


async def test_a_memory_files_edit_cancel_save_and_rollback_keep_the_keyboards_place(server: SpriteOS) -> None:
    install_templates(server.settings)
    MemoryFiles(server.settings.layout).write("user.md", "# User\n- Name: Ada\n", source="seed")
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.memory("files")
        keys = tab.page.keyboard
        for leave in ("file-cancel", "file-save"):
            await tab.by("file-edit").focus()
            await keys.press("Enter")
            await expect(tab.by("file-editor")).to_be_focused()  # straight into the text
            await keys.press("End")
            await keys.type("- Tea\n")
            await tab.by(leave).focus()
            await keys.press("Enter")
            await expect(tab.by("file-text")).to_be_visible()
            await expect(tab.by("file-edit")).to_be_focused()  # back where the edit began
        await expect(tab.by("memory-flash")).to_contain_text("Saved user.md")
        await tab.by("file-version").filter(has_text="seed").get_by_role("button").click()
        await tab.by("file-rollback").focus()
        await keys.press("Enter")
        await expect(tab.by("memory-flash")).to_contain_text("text again")
        await expect(tab.by("file-edit")).to_be_focused()
        tab.assert_clean()


async def test_an_upload_from_another_device_keeps_the_focus_on_the_file_it_was_on(
        server: SpriteOS, tmp_path: Path) -> None:
    (server.settings.layout.root / "documents" / "lease.txt").write_text("The lease ends on 2027-03-31.\n")
    picked = tmp_path / "notes.txt"
    picked.write_text("notes")
    async with chromium() as browser:
        laptop = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        phone = await open_tab(browser, laptop.base)
        for tab in (laptop, phone):
            await tab.sign_in()
            await tab.connected()
            await tab.by("files-tab").click()
            await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
            await expect(tab.by("files-view")).to_have_attribute("data-path", "documents")
        lease = laptop.page.locator('[data-name="lease.txt"]').get_by_test_id("download")
        await lease.focus()
        await phone.by("upload-input").set_input_files(str(picked))
        await expect(laptop.by("file-entry").filter(has_text="notes.txt")).to_have_count(1)  # drawn again
        await expect(lease).to_be_focused()
        laptop.assert_clean()
        phone.assert_clean()


async def test_forget_and_undo_by_keyboard_leave_the_focus_on_what_comes_next(server: SpriteOS) -> None:
    """A learning's Forget puts the focus on its Undo (and Undo back on Forget); a turn's Forget for
    good on the tombstone that replaces it: never on <body>."""
    db = MemoryDB(server.settings.layout.memory_db)
    try:
        db.commit_batch(trigger="test", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0.0,
                        learnings=[NewLearning(type="FACT", content="Ada drinks tea in the morning")],
                        file_updates={}, base_hashes={})
    finally:
        db.close()
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        keys = tab.page.keyboard
        await tab.send("Remember the tea")
        await expect(tab.by("turn-status")).to_have_count(1)
        await tab.by("forget-turn").focus()
        await keys.press("Enter")
        await expect(tab.by("forget-confirm")).to_be_focused()
        await keys.press("Enter")
        await expect(tab.by("tombstone")).to_be_focused()

        await tab.memory("learnings")
        learning = tab.by("learning").filter(has_text="Ada drinks tea")
        await learning.get_by_test_id("learning-forget").focus()
        await keys.press("Enter")
        await expect(learning).to_have_attribute("data-forgotten", "true")
        await expect(learning.get_by_test_id("learning-undo")).to_be_focused()
        await keys.press("Enter")
        await expect(learning).to_have_attribute("data-forgotten", "false")
        await expect(learning.get_by_test_id("learning-forget")).to_be_focused()
        tab.assert_clean()


async def test_a_show_more_button_pressed_by_keyboard_leaves_the_focus_on_what_came(server: SpriteOS) -> None:
    """Show older sessions, or Show earlier turns, pressed by keyboard: the button goes when its page comes,
    and the focus fell to the page's body, the keyboard user's place lost. It goes to the first session
    shown, to the next page's button, or, with no more pages, to the list of turns."""
    current = server.runtime.session_id
    db = TranscriptDB(server.settings.layout.transcript_db)
    try:
        for n in range(25):  # a page of 20 sessions and more; the newest past one has 45 turns (20 a page)
            for k in range(45 if n == 24 else 1):
                db.append(NewObservation(timestamp=time.time() - 7200 + n * 60 + k / 10, session_id=f"past-{n:02d}",
                                         sequence_num=k + 1, user_message=f"Session {n} question {k}",
                                         tool_calls_json="[]", agent_response=f"Answer {k}", status="completed"))
        for k in range(36):  # and the session the chat shows: 30 turns a page
            db.append(NewObservation(timestamp=time.time() - 600 + k, session_id=current, sequence_num=k + 1,
                                     user_message=f"Now question {k}", tool_calls_json="[]",
                                     agent_response=f"Answer {k}", status="completed"))
    finally:
        db.close()
    at = """() => {  // what has the focus: a session's open button, a show-more button, a list, or the body
        const a = document.activeElement;
        return a.closest("[data-testid=past-session]")?.dataset.sessionId ?? a.dataset.testid ?? a.tagName.toLowerCase();
    }"""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await expect(tab.messages("user")).to_have_count(30)
        await tab.by("load-earlier").focus()
        await tab.page.keyboard.press("Enter")
        await expect(tab.messages("user")).to_have_count(36)
        await expect(tab.by("load-earlier")).to_have_count(0)
        assert await tab.page.evaluate(at) == "messages"  # the conversation, no more pages above
        await tab.by("past-sessions").click()
        await expect(tab.by("past-session")).to_have_count(20)
        await tab.by("sessions-more").focus()
        await tab.page.keyboard.press("Enter")
        await expect(tab.by("past-session")).to_have_count(26)
        first_older = await tab.by("past-session").nth(20).get_attribute("data-session-id")
        assert await tab.page.evaluate(at) == first_older  # the first session the page brought
        await tab.by("past-session").filter(has_text="Session 24 question 0").get_by_role("button").click()
        turns = tab.by("past-turns").locator('[data-testid="message"][data-role="user"]')
        await expect(turns).to_have_count(20)
        await tab.by("load-earlier").focus()
        await tab.page.keyboard.press("Enter")
        await expect(turns).to_have_count(40)
        assert await tab.page.evaluate(at) == "load-earlier"  # the next page's button
        await tab.page.keyboard.press("Enter")
        await expect(turns).to_have_count(45)
        await expect(tab.by("load-earlier")).to_have_count(0)
        assert await tab.page.evaluate(at) == "past-turns"  # the session's turns, no more pages above
        tab.assert_clean()
