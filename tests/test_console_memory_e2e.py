"""The console's memory tab in a real Chromium, after real batches: find a learning and the turn
it came from, forget it (and undo), a person's edit of user.md that the daemon's next batch
keeps, a rollback, the daemon's health and the next boot prompt. Real server, real CLI, the
mock Bridge as model and curator."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from playwright.async_api import WebSocketRoute, expect

from devkit.harness import TOKEN
from devkit.mock_bridge import Fault, MockBridge
from sprite_os import gateway
from sprite_os.config import Settings
from sprite_os.console import memory_frames
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall.learnings import search_learnings
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.server import SpriteOS
from tests.conftest import client_factory, running, wait_for
from tests.console_browser import (
    Tab,
    chromium,
    install_templates,
    intercepted,
    open_tab,
    screenshot,
    screenshot_dir,
    signed_in,
)
from tests.test_console_kept_messages_e2e import Held

pytestmark = pytest.mark.e2e

# How often Health asks again while shown, as the page has it (the test runs the page's clock on by as much).
HEALTH_EVERY_MS = int(re.findall(r"^const HEALTH_EVERY_MS = (\d+);", (
    Path(memory_frames.__file__).parent / "static/js/memory_status.js").read_text(), re.MULTILINE)[0])


def processed(settings: Settings) -> int:
    db = TranscriptDB(settings.layout.transcript_db)
    try:
        return db.counts()["processed"]
    finally:
        db.close()


def found(settings: Settings, word: str) -> list[str]:
    """What the agent's search (and `memory search`) returns, read from memory.db directly."""
    db = MemoryDB(settings.layout.memory_db)
    try:
        return [hit.content for hit in search_learnings(db, [word], 10)]
    finally:
        db.close()


class HeldLoad:
    """Holds the server's answer to a request of `kind` while `meanwhile` runs: a reload on its way
    when the person moves the keyboard."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, kind: type) -> None:
        self.holding, self.held, self.released = False, asyncio.Event(), asyncio.Event()
        request = gateway._Connection._request

        async def held(conn: gateway._Connection, frame: object) -> None:
            if self.holding and isinstance(frame, kind):
                self.held.set()
                await self.released.wait()
            await request(conn, frame)  # type: ignore[arg-type]

        monkeypatch.setattr(gateway._Connection, "_request", held)

    async def around(self, ask: Awaitable[None], meanwhile: Awaitable[None]) -> None:
        self.holding = True
        self.held.clear()
        self.released.clear()
        await ask
        await asyncio.wait_for(self.held.wait(), timeout=30)
        await meanwhile
        self.holding = False
        self.released.set()


async def chat_turn(tab: Tab, text: str) -> None:
    await tab.send(text)
    await expect(tab.messages("assistant").last).to_contain_text(f"You said: {text}")


async def test_find_a_learning_open_its_turn_forget_it_and_undo(
        server: SpriteOS, bridge: MockBridge, settings: Settings, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    install_templates(settings)
    bridge.curator.script("FACT: The user's name is Ada Lovelace [#1]\nPREFERENCE: Likes tea in the morning [#1]\n"
                          "USER_MD_UPDATE:\n# User\n- Name: Ada Lovelace\n- Tea in the morning\n")
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await chat_turn(tab, "Hi, I'm Ada Lovelace and I drink tea every morning.")
        await tab.by("new-session").click()  # the session's end triggers the batch
        await wait_for(lambda: processed(settings) == 1, timeout=30, what="the batch")

        await tab.memory("learnings")
        await tab.by("learning-search").fill("Ada")
        await tab.by("learning-search-button").click()
        await expect(tab.by("memory-panel-learnings")).to_contain_text("found for “Ada”")  # not the listing before it
        learning = tab.by("learning").filter(has_text="The user's name is Ada Lovelace")
        await expect(learning).to_have_count(1)
        await expect(learning).to_contain_text("FACT")
        await expect(learning).to_contain_text("confidence")
        await expect(learning.get_by_test_id("learning-source")).to_contain_text("from turn 1 of session")
        await learning.get_by_test_id("learning-source").click()
        await expect(learning.get_by_test_id("turn")).to_contain_text("Hi, I'm Ada Lovelace and I drink tea")
        await screenshot(tab, shots, "memory-learnings-light")

        await learning.get_by_test_id("learning-forget").click()
        await expect(learning).to_have_attribute("data-forgotten", "true")
        assert found(settings, "lovelace") == []  # search no longer returns it
        await tab.by("learning-search-button").click()
        await expect(tab.by("learning").filter(has_text="The user's name is Ada Lovelace")).to_have_count(0)
        # the turn it came from is still found: the transcript is the record, and it offers no Forget
        episode = tab.by("learning").filter(has_text="I drink tea every morning")
        await expect(episode).to_have_attribute("data-type", "EPISODE")
        await expect(episode.get_by_test_id("learning-forget")).to_have_count(0)
        await tab.by("learning-search").fill("")  # no query: the newest learnings
        await tab.by("learning-search-button").click()
        await expect(tab.by("learning").filter(has_text="Likes tea")).to_have_count(1)
        await expect(tab.by("learning").filter(has_text="Ada Lovelace")).to_have_count(0)
        await tab.by("learning-forgotten").check()
        forgotten = tab.by("learning").filter(has_text="Ada Lovelace")
        await expect(forgotten).to_have_attribute("data-forgotten", "true")
        await forgotten.get_by_test_id("learning-undo").click()
        await expect(forgotten).to_have_attribute("data-forgotten", "false")
        assert found(settings, "lovelace") == ["The user's name is Ada Lovelace"]

        await tab.memory("health")
        await expect(tab.by("memory-state")).to_contain_text("healthy")
        await expect(tab.by("memory-last-batch")).to_contain_text("done")
        await expect(tab.by("memory-last-batch")).to_contain_text("new learning")  # the line under it
        await expect(tab.by("memory-audit")).to_contain_text("unforget")
        await expect(tab.by("agent-spend")).to_contain_text(f"of ${settings.agent_daily_budget_usd:.4f}")
        await expect(tab.by("agent-spend")).to_contain_text("starts again")
        await screenshot(tab, shots, "memory-health-light")
        await tab.memory("boot")
        await expect(tab.by("boot-prompt")).to_contain_text("- Name: Ada Lovelace")
        await expect(tab.by("boot-prompt-size")).to_contain_text("tokens")
        await screenshot(tab, shots, "memory-boot-prompt-light")
        await tab.by("theme-toggle").click()
        await tab.memory("learnings")
        await tab.by("learning-forgotten").uncheck()
        await expect(tab.by("learning")).to_have_count(2)
        await screenshot(tab, shots, "memory-learnings-dark")
        await tab.memory("files")
        await expect(tab.by("memory-file").filter(has_text="user.md")).to_contain_text("3 / 200 lines")
        await screenshot(tab, shots, "memory-files-dark")
        tab.assert_clean()


async def test_showing_the_learnings_again_keeps_an_opened_turn_and_a_forget_being_confirmed(
        server: SpriteOS, bridge: MockBridge, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Showing the tab again (or Refresh) drew every learning afresh: the turn the person had opened
    closed, and the "Forget for good?" they were reading went back to "Forget…". Kept, the item is
    taken out and put back: the keyboard stays on the control it was on."""
    search = HeldLoad(monkeypatch, memory_frames.MemorySearchRequest)
    install_templates(settings)
    bridge.curator.script("FACT: The user's name is Ada Lovelace [#1]\n")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await chat_turn(tab, "Hi, I'm Ada Lovelace.")
        await tab.by("new-session").click()
        await wait_for(lambda: processed(settings) == 1, timeout=30, what="the batch")
        await tab.memory("learnings")
        learning = tab.by("learning").filter(has_text="The user's name is Ada Lovelace")
        await learning.get_by_test_id("learning-forget").click()
        await expect(learning).to_have_attribute("data-forgotten", "true")
        await tab.by("learning-forgotten").check()  # the forgotten ones, each offering to forget its turn
        await expect(tab.by("memory-panel-learnings")).to_contain_text("forgotten, newest forgetting first")
        await learning.get_by_test_id("learning-source").click()
        await expect(learning.get_by_test_id("turn")).to_contain_text("Hi, I'm Ada Lovelace.")
        await learning.get_by_test_id("forget-turn").click()
        await expect(learning.get_by_test_id("forget-confirm")).to_be_visible()

        for again in (tab.by("memory-section-learnings"), tab.by("memory-refresh")):
            await again.click()
            await expect(tab.by("memory-panel-learnings")).not_to_have_attribute("data-loading", "true")
            await expect(learning.get_by_test_id("turn")).to_contain_text("Hi, I'm Ada Lovelace.")
            await expect(learning.get_by_test_id("forget-confirm")).to_be_visible()
        await search.around(tab.by("memory-refresh").click(),  # the reload is on its way...
                            learning.get_by_test_id("forget-confirm").focus())  # ...when the keyboard is on it
        await expect(tab.by("memory-panel-learnings")).not_to_have_attribute("data-loading", "true")
        await expect(learning.get_by_test_id("forget-confirm")).to_be_focused()
        await learning.get_by_test_id("forget-confirm").click()  # still the person's to answer
        await expect(tab.by("memory-flash")).to_contain_text("Forgotten for good: the turn")
        tab.assert_clean()


FIRST_REPLY = "FACT: Ada likes tea\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n- Likes tea\n"
EDIT = "# User\n- Name: Ada\n- Pronouns: she/her (added in the console)\n"
SECOND_REPLY = f"FACT: Ada likes tea\nUSER_MD_UPDATE:\n{EDIT}- Likes tea\n"


DRAFT = "# User\n- Name: Ada\n- Tea in the morning\n"


@contextlib.asynccontextmanager
async def editing_user_md(server: SpriteOS) -> AsyncIterator[tuple[Tab, MemoryFiles]]:
    """A signed-in page editing user.md ("# User\n- Name: Ada\n", a version after the templates'),
    DRAFT typed in and not saved."""
    install_templates(server.settings)
    files = MemoryFiles(server.settings.layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="seed")
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.memory("files")
        await tab.by("file-edit").click()
        await tab.by("file-editor").fill(DRAFT)
        yield tab, files


async def test_a_draft_survives_a_reload_and_a_file_that_moved_on_is_said_before_the_save(
        server: SpriteOS, tmp_path: Path) -> None:
    draft = DRAFT
    async with editing_user_md(server) as (tab, files):
        panel = tab.by("memory-panel-files")
        for reload in ("memory-refresh", "memory-section-learnings", "memory-section-files"):
            await tab.by(reload).click()
            await expect(panel).not_to_have_attribute("data-loading", "true")
        await expect(tab.by("file-editor")).to_have_value(draft)  # not the saved text, not gone
        await expect(tab.by("file-save")).to_be_enabled()

        files.write("user.md", "# User\n- Name: Ada\n- Likes jazz\n", source="batch-9")  # the daemon, meanwhile
        await tab.by("memory-refresh").click()
        await expect(tab.by("memory-flash")).to_contain_text("changed since you began editing: your draft is kept")
        await expect(tab.by("file-editor")).to_have_value(draft)
        await tab.by("file-save").click()
        await expect(tab.by("memory-flash")).to_contain_text("nothing was saved")
        assert files.read("user.md") == "# User\n- Name: Ada\n- Likes jazz\n"
        await expect(tab.by("file-editor")).to_have_value(draft)  # still there to copy
        await tab.by("file-cancel").click()
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n- Likes jazz\n")
        tab.assert_clean()


async def test_a_save_the_disk_did_not_confirm_is_shown_saved_with_the_warning_and_the_editor_closes(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The edit was written, then the folder's fsync failed (`not_durable`): the person reads that it was
    saved and may not survive a power loss, sees the file as saved, and is not left in an editor whose next
    Save would be refused as "saved from another tab"."""
    import os

    from devkit.faults import FsyncSpy

    draft = DRAFT
    async with editing_user_md(server) as (tab, files):
        spy = FsyncSpy()
        monkeypatch.setattr(os, "fsync", spy)
        spy.failing.add(files.path("user.md").parent)
        await tab.by("file-save").click()
        await expect(tab.by("memory-flash")).to_have_text(
            "user.md was saved as version 3, but the disk reported an error (Input/output error): the change may not survive a power loss")
        await expect(tab.by("file-text")).to_have_text(draft)
        await expect(tab.by("file-editor")).to_have_count(0)
        assert files.read("user.md") == draft
        tab.assert_clean()


async def test_health_says_why_an_import_waits_while_its_attempts_fail(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two failed attempts of an import (here its inbox unreadable: a full disk, a bad block) Health
    answered nothing at all; it shows the panel, and the last attempt's error."""
    import errno

    from sprite_os.memory import import_inbox

    def unreadable(layout: object, ending: str = import_inbox.SUFFIX) -> list[Path]:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(import_inbox, "inbox_files", unreadable)
    assert server.memory is not None
    await wait_for(lambda: server.memory is not None and server.memory.imports.failing > 0, timeout=30)
    async with health_tab(server) as tab:
        await expect(tab.by("memory-import-failing")).to_contain_text("Input/output error")
        await expect(tab.by("memory-searchable")).to_be_visible()


@contextlib.asynccontextmanager
async def health_tab(server: SpriteOS, *, clock: bool = False, width: int | None = None) -> AsyncIterator[Tab]:
    """A signed-in page on memory's Health view; clean after what the block checks. `clock`: the page's timers
    on Playwright's clock, which the test runs on (`page.clock.run_for`). `width`: the window's, in px."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/",
                             **({"viewport": {"width": width, "height": 700}} if width else {}))
        if clock:
            await tab.page.clock.install()
        await tab.sign_in()
        await tab.connected()
        await tab.memory("health")
        yield tab
        tab.assert_clean()


async def test_health_says_a_forget_an_error_cut_short_is_not_finished_until_it_is(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget an error cut short keeps the turn's words until the person forgets it again: the console's
    Health said nothing of it (only /healthz, for the operator). It says so, in which session (never a word of
    the turn), and what to do; once forgotten again, nothing."""
    from sprite_os.memory.forget.jobs import jobs
    from sprite_os.memory.transcript_store import NewObservation

    memory = server.memory
    assert memory is not None

    def write(t: TranscriptDB) -> int:
        t.start_session("s-cut", 1_781_524_800.0)  # 2026-06-15 12:00 UTC: that day in any time zone within 11 h
        return t.append(NewObservation(2.0, "s-cut", 1, "My locker code is 4417", "[]", "Noted.")) or 0

    turn = await memory.transcript.call(write)

    def failing(*_: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(TranscriptDB, "forget", failing)
    with pytest.raises(OSError):
        await memory.forget_turns([turn], by="test")
    monkeypatch.undo()
    await wait_for(lambda: memory.forgetting.status(0.0)["cut_short_jobs"] == 1, timeout=30, what="the pass's count")
    async with health_tab(server) as tab:
        await expect(tab.by("memory-forgets")).to_contain_text("Forgetting is stuck")
        await expect(tab.by("memory-forgets")).to_contain_text("forget the turn again")
        await expect(tab.by("memory-forgets")).to_contain_text("in the session of 2026-06-15")  # where to find it
        await expect(tab.by("memory-forgets")).not_to_contain_text("4417")
        await expect(tab.by("memory-forgets")).to_have_class(re.compile(r"\bfailing\b"))  # in red, as the daemon's
        await memory.forget_turns([turn], by="test")
        await wait_for(lambda: memory.memory.call(lambda m: not jobs(m)), timeout=60, what="the forget finished")
        await wait_for(lambda: memory.forgetting.status(0.0)["cut_short_jobs"] == 0, timeout=30, what="the count")
        await tab.by("memory-refresh").click()
        await expect(tab.by("memory-forgets")).to_have_count(0)

        # A forget of a whole session cut short: the person forgets the session again, not "the turn"; said on
        # Health's own refresh, nobody clicking.
        await memory.transcript.call(lambda t: t.append(NewObservation(3.0, "s-cut", 2, "And my PIN is 9921", "[]", "Ok.")))
        monkeypatch.setattr(TranscriptDB, "forget", failing)
        with pytest.raises(OSError):
            await memory.forget_turns(session_id="s-cut", by="test")
        monkeypatch.undo()
        await expect(tab.by("memory-forgets")).to_contain_text("forget the session again to finish it")
        await memory.forget_turns(session_id="s-cut", by="test")
        await expect(tab.by("memory-forgets").filter(has_text="failed part way")).to_have_count(0)


async def test_health_names_a_backup_the_forget_could_not_read_and_says_to_remove_it(server: SpriteOS) -> None:
    """A backup of memory the forget's pass could not read may still hold the forgotten turn's words: /healthz
    named it for the operator, the console's Health nothing (memory degraded, no word why). Health names it,
    in red, says what it means and that it must be removed; not that forgetting is stuck; once it is gone,
    nothing."""
    await health_names_an_unreadable_backup(server, "memory.db.before-rebuild-20250101T000000")


async def test_a_backup_with_a_long_name_fits_health_on_a_small_phone(server: SpriteOS) -> None:
    """A backup's name runs to 255 bytes with no space in it: Health's stat showed it on one line, past the
    window's right edge, and the whole page scrolled sideways at 280 px. It wraps."""
    await health_names_an_unreadable_backup(server, "memory.db.before-rebuild-" + "x" * 230, width=280)


async def health_names_an_unreadable_backup(server: SpriteOS, name: str, width: int | None = None) -> None:
    from sprite_os.memory.forget.jobs import jobs
    from sprite_os.memory.transcript_store import NewObservation
    from tests.test_console_modules_e2e import OVERFLOW

    memory = server.memory
    assert memory is not None
    damaged = memory.settings.layout.memory_dir / name
    damaged.write_bytes(b"SQLite format 3\x00" + b"My locker code is 4417 " * 400)

    def write(t: TranscriptDB) -> int:
        t.start_session("s-old", 1_781_524_800.0)
        return t.append(NewObservation(2.0, "s-old", 1, "My locker code is 4417", "[]", "Noted.")) or 0

    turn = await memory.transcript.call(write)
    await memory.forget_turns([turn], by="test")
    await wait_for(lambda: memory.memory.call(lambda m: not jobs(m)), timeout=60, what="the forget finished")
    await wait_for(lambda: asyncio.sleep(0, result=bool(memory.forgetting.unreadable_backups)), timeout=30,
                   what="the pass said the backup unreadable")
    async with health_tab(server, width=width) as tab:
        shown = tab.by("memory-forget-unreadable")
        await expect(shown).to_contain_text(f".os/memory/{damaged.name}")
        assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}
        # nor past its own box, the memory view scrolling sideways within itself
        assert await shown.evaluate("(e) => [e.scrollWidth - e.clientWidth, e.closest('.view-memory').scrollWidth"
                                    " - e.closest('.view-memory').clientWidth]") == [0, 0]
        await expect(shown).to_contain_text("may still hold them")
        await expect(shown).to_contain_text("should remove the file")
        await expect(shown).not_to_contain_text("4417")
        await expect(shown).to_have_class(re.compile(r"\bfailing\b"))  # in red: memory is degraded
        await expect(tab.by("memory-forgets")).to_have_count(0)  # no forget waits: not "Forgetting is stuck"
        damaged.unlink()  # the operator removed it: Health's own refresh says so, nobody clicking
        await expect(shown).to_have_count(0)


async def test_health_keeps_itself_current_while_shown_and_visible_and_keeps_its_numbers_when_a_refresh_fails(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """Health was loaded once, when the person opened it: a turn recorded after showed only once they clicked
    away and back. Shown, it asks again on its own (the page's clock run on here, not waited for), never
    while the page is hidden (once at once when it is visible again), nor once the person left it; a
    refresh refused keeps the numbers and says from when they are, and a stat that did not move is not
    drawn again."""
    from sprite_os.memory.transcript_store import NewObservation

    memory = server.memory
    assert memory is not None
    asked, refusing = [], False

    async def count(conn: object, frame: str) -> bool:
        if '"memory_health"' not in frame:
            return False
        asked.append(frame)
        if refusing:
            conn._error("busy", "try again in a moment", json.loads(frame)["request_id"])  # type: ignore[attr-defined]
        return refusing

    intercepted(monkeypatch, count)
    turn = 0

    async def record() -> None:  # a turn the agent's session recorded meanwhile
        nonlocal turn
        turn += 1
        await memory.transcript.call(lambda t: t.append(NewObservation(2.0 + turn, "s-live", turn, "hi", "[]", "ok")))

    async def refreshed() -> None:  # the page's clock past the wait, and the refresh it asked for answered
        before = len(asked)
        await tab.page.clock.run_for(HEALTH_EVERY_MS)
        await wait_for(lambda: len(asked) == before + 1, timeout=30, what="the refresh")

    async with health_tab(server, clock=True) as tab:
        await expect(tab.by("memory-turns")).to_contain_text("0 (")
        await tab.by("memory-state").evaluate("(node) => { node.kept = true; }")  # a stat that will not move
        await record()
        await refreshed()
        await expect(tab.by("memory-turns")).to_contain_text("1 (")  # nobody clicked anything
        assert await tab.by("memory-state").evaluate("(node) => node.kept === true")  # not drawn again

        hide = "(hidden) => { Object.defineProperty(document, 'visibilityState', {value: hidden ? 'hidden' : 'visible', " \
               "configurable: true}); document.dispatchEvent(new Event('visibilitychange')); }"
        await tab.page.evaluate(hide, True)
        await record()
        before = len(asked)
        for _ in range(6):  # half a minute of the page's clock
            await tab.page.clock.run_for(HEALTH_EVERY_MS)
        await tab.by("memory-turns").evaluate("(node) => node")  # the page has run what those timers did
        assert len(asked) == before
        await tab.page.evaluate(hide, False)  # visible again: asked at once, no wait
        await expect(tab.by("memory-turns")).to_contain_text("2 (")
        assert len(asked) == before + 1

        refusing = True
        await record()
        await refreshed()
        await expect(tab.by("memory-health-stale")).to_contain_text("Could not refresh: these numbers are from")
        await expect(tab.by("memory-health-stale")).to_have_attribute("role", "status")
        await expect(tab.by("memory-turns")).to_contain_text("2 (")  # kept, not emptied
        await tab.by("memory-health-stale").evaluate("(node) => { node.firstChild.kept = true; }")
        await refreshed()  # tried again, said once (a screen reader is not read the same words again), nowhere else
        assert await tab.by("memory-health-stale").evaluate("(node) => node.firstChild.kept === true")
        await expect(tab.by("memory-health-stale")).to_have_text(
            re.compile(r"^Could not refresh: these numbers are from \d\d:\d\d:\d\d; trying again\.$"))
        await expect(tab.by("memory-flash")).to_have_text("")
        refusing = False
        await refreshed()
        await expect(tab.by("memory-turns")).to_contain_text("3 (")
        await expect(tab.by("memory-health-stale")).to_have_text("")

        await tab.by("memory-section-files").click()  # left: no more refreshes
        await expect(tab.by("memory-panel-files")).not_to_have_attribute("data-loading", "true")
        before = len(asked)
        for _ in range(3):
            await tab.page.clock.run_for(HEALTH_EVERY_MS)
        await tab.memory("health")  # shown again: loaded once, as the page asked for nothing meanwhile
        assert len(asked) == before + 1
        await expect(tab.by("memory-turns")).to_contain_text("3 (")


async def test_health_says_an_import_the_server_gave_up_on_waits_for_the_operator(server: SpriteOS) -> None:
    """A file set aside after its attempts failed was shown as "Import waiting: its last attempt failed",
    under a comment that the server retries on its own; it is never retried until the operator acts."""
    from sprite_os.memory import import_inbox

    aside = import_inbox.inbox_dir(server.settings.layout) / f"past{import_inbox.SUFFIX}{import_inbox.SET_ASIDE_SUFFIX}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    aside.write_text("")
    async with health_tab(server) as tab:
        await expect(tab.by("memory-import-set-aside")).to_contain_text("Import given up")
        await expect(tab.by("memory-import-set-aside")).to_contain_text(aside.name)
        await expect(tab.by("memory-import-set-aside")).to_contain_text("rename it back")
        await expect(tab.by("memory-import-failing")).to_have_count(0)


async def test_health_says_in_words_what_the_curator_said_that_memory_left_out(server: SpriteOS) -> None:
    """Learnings past the bound of a call, lines the format has no rule for and file rewrites not applied were
    only in the server's log: Health says them, in words a person reads, once there are any."""
    from sprite_os.memory.memory_store import LeftOut

    memory = server.memory
    assert memory is not None
    async with health_tab(server, clock=True) as tab:
        await expect(tab.by("memory-turns")).to_be_visible()
        await expect(tab.by("memory-left-out")).to_have_count(0)  # nothing left out: nothing said
        await memory.memory.call(lambda m: m.commit_batch(
            trigger="batch", observation_ids=[], model="claude-haiku-4-5", input_tokens=100, output_tokens=20,
            cost_usd=0.0002, learnings=[], file_updates={}, base_hashes={},
            left_out=LeftOut(learnings_over_bound=12, lines_ignored=1, files_rejected=2)))
        await tab.page.clock.run_for(HEALTH_EVERY_MS)  # the page's next refresh
        shown = tab.by("memory-left-out")
        await expect(shown).to_contain_text("What the curator said that memory left out")
        # Each count with its unit: "15 in all" summed learnings, lines and rewrites; and "its rules" named no one.
        await expect(shown.locator(".value")).to_have_text("12 learnings, 1 line, 2 file rewrites")
        await expect(shown).to_contain_text("12 learnings past what one call may keep were left out")
        await expect(shown).to_contain_text("1 line that followed none of the reply format's rules was ignored")
        await expect(shown).to_contain_text("2 memory file rewrites were not applied (given twice, empty, cut off, too long, or of a file the curator may not write)")


async def test_a_rollback_the_disk_did_not_confirm_is_shown_done_with_the_warning_and_the_draft_dropped(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback was written, then the folder's fsync failed (`not_durable`): the page only flashed the
    error, kept showing the old text and the draft, and a second click on Rollback made another version."""
    import os

    from devkit.faults import FsyncSpy

    async with editing_user_md(server) as (tab, files):
        first = files.history("user.md")[0]
        spy = FsyncSpy()
        monkeypatch.setattr(os, "fsync", spy)
        spy.failing.add(files.path("user.md").parent)
        said = ["user.md was saved as version 3, but the disk reported an error (Input/output error): the change "
                "may not survive a power loss",
                f"user.md is version {first.number}'s text again (saved as version 3)."]  # the same click again
        for flash in said:
            await tab.by("file-version").last.get_by_role("button").click()  # oldest last
            await tab.by("file-rollback").click()
            await expect(tab.by("memory-flash")).to_have_text(flash)
            await expect(tab.by("file-text")).to_have_text(first.text)
            await expect(tab.by("file-editor")).to_have_count(0)
        assert files.read("user.md") == first.text
        assert [v.source for v in files.history("user.md")][-1] == f"rollback-to-{first.number}"
        assert len(files.history("user.md")) == 3
        tab.assert_clean()


async def test_a_reload_that_lands_while_the_keyboard_is_on_a_control_leaves_the_focus_on_it(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    install_templates(server.settings)
    MemoryFiles(server.settings.layout).write("user.md", "# User\n- Name: Ada\n", source="seed")
    listing = HeldLoad(monkeypatch, memory_frames.MemoryFilesRequest)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.memory("files")
        panel = tab.by("memory-panel-files")
        for control in (tab.by("file-edit"), tab.by("memory-file").filter(has_text="user.md").get_by_role("button")):
            await listing.around(tab.by("memory-refresh").click(),  # the reload is on its way...
                                 control.focus())  # ...when the person tabs onto a control it will render again
            await expect(panel).not_to_have_attribute("data-loading", "true")
            await expect(control).to_be_focused()  # its successor has the focus, not the page's top
        await tab.by("file-edit").focus()
        await tab.page.keyboard.press("Enter")
        await expect(tab.by("file-editor")).to_be_visible()
        tab.assert_clean()


async def test_a_section_shown_twice_says_it_is_loading_until_the_second_load_ends(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    install_templates(server.settings)
    held: list[asyncio.Event] = []
    request = gateway._Connection._request

    async def file_held(conn: gateway._Connection, frame: object) -> None:
        if isinstance(frame, memory_frames.MemoryFileRequest):
            held.append(asyncio.Event())
            await held[-1].wait()
        await request(conn, frame)  # type: ignore[arg-type]

    monkeypatch.setattr(gateway._Connection, "_request", file_held)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        panel = tab.by("memory-panel-files")
        await tab.by("memory-tab").click()  # opens the files section: one load...
        await wait_for(lambda: len(held) == 1, timeout=30, what="the first load's file")
        await tab.by("memory-section-files").click()  # ...and a second while it is on its way
        held[0].set()
        await wait_for(lambda: len(held) == 2, timeout=30, what="the second load's file")
        await expect(panel).to_have_attribute("data-loading", "true")  # the first load's end is not the section's
        held[1].set()
        await expect(panel).not_to_have_attribute("data-loading", "true")
        await expect(tab.by("file-text")).to_be_visible()
        tab.assert_clean()


class HeldAnswers:
    """The answers of `kind` the Sprite sends the page, held on their way (the server answers a connection's
    requests in turn, so a later answer can come first only on the link) until the test lets each go."""

    def __init__(self, kind: str) -> None:
        self.kind, self.holding, self.held = kind, False, list[str]()
        self.page_side: WebSocketRoute | None = None

    def route(self, page_side: WebSocketRoute) -> None:
        self.page_side = page_side
        server_side = page_side.connect_to_server()

        def from_server(message: str | bytes) -> None:
            if self.holding and isinstance(message, str) and f'"type":"{self.kind}"' in message.replace(" ", ""):
                self.held.append(message)
            else:
                page_side.send(message)

        server_side.on_message(from_server)

    def release(self, index: int) -> None:
        assert self.page_side is not None
        self.page_side.send(self.held[index])


async def test_a_search_and_a_refresh_of_learnings_are_one_sections_loads(server: SpriteOS) -> None:
    """Learnings' Search counted its loads apart from the section's Refresh: a Search sent after a Refresh
    drew its answer while the section still said it was loading (the Refresh's, on its way)."""
    install_templates(server.settings)
    answers = HeldAnswers("memory_search_result")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=answers.route)
        panel = tab.by("memory-panel-learnings")
        await tab.memory("learnings")
        answers.holding = True
        await tab.by("memory-refresh").click()
        await tab.by("learning-search").fill("tea")
        await tab.by("learning-search-button").click()
        await wait_for(lambda: len(answers.held) == 2, timeout=30, what="both answers on their way")
        await expect(panel).to_have_attribute("data-loading", "true")
        answers.release(1)  # the search's answer first: the newest load of the section
        await expect(panel).to_contain_text("found for “tea”")
        await expect(panel).not_to_have_attribute("data-loading", "true")
        answers.release(0)  # the refresh's, older: not drawn over it
        await expect(panel).not_to_contain_text("newest")
        await asyncio.sleep(0.3)
        await expect(panel).to_contain_text("found for “tea”")
        tab.assert_clean()


async def test_a_persons_edit_in_the_page_is_kept_by_the_next_batch_and_a_file_rolls_back(
        bridge: MockBridge, settings: Settings, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    settings = settings.with_overrides(memory_batch_turns=1)
    files = MemoryFiles(settings.layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="seed")
    install_templates(settings)
    bridge.faults.add(Fault("latency", seconds=4.0, target="curator", times=1))
    bridge.curator.script(FIRST_REPLY)  # written from the file before the edit: must not land
    bridge.curator.script(SECOND_REPLY)  # the batch again, on the edited file
    async with running(settings) as app, chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{app.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.memory("files")
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n")
        await tab.by("file-edit").click()
        await tab.by("file-editor").fill(EDIT)
        async with client_factory(app.port) as connect:  # the turn comes from another device
            other = await connect(hello={})
            await other.send(type="user_message", text="I like tea")
            await other.until("turn_complete")
        await bridge.wait_for(lambda b: len(b.curator_requests()) >= 1)
        await tab.by("file-save").click()  # while the batch's curator call is out
        await expect(tab.by("memory-flash")).to_contain_text("Saved user.md as version")
        await wait_for(lambda: processed(settings) == 1, timeout=30, what="the batch, run again")

        assert "- Pronouns: she/her (added in the console)" in files.read("user.md")
        assert files.read("user.md") == EDIT + "- Likes tea\n"
        second = bridge.curator_requests()[1]
        assert "added in the console" in second.last_user_text  # it built on the person's edit
        history = files.history("user.md")
        assert "person-edit" in [v.source for v in history]
        assert "# User\n- Name: Ada\n- Likes tea\n" not in [v.text for v in history]  # the stale reply never landed

        await tab.by("memory-section-files").click()  # reload: the daemon's version is current
        await expect(tab.by("file-text")).to_contain_text("- Likes tea")
        seed = tab.by("file-version").filter(has_text="seed")
        await seed.get_by_role("button").click()
        await expect(tab.by("file-diff")).to_contain_text("+- Name: Ada")
        await screenshot(tab, shots, "memory-files-light")
        await expect(seed.get_by_role("button")).to_have_attribute("aria-current", "true")  # the one shown
        await tab.by("file-rollback").click()
        await expect(tab.by("memory-flash")).to_contain_text("is version 1's text again")
        assert files.read("user.md") == "# User\n- Name: Ada\n"
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n")
        assert files.history("user.md")[-1].source == "rollback-to-1"
        current = tab.by("file-version").first  # newest first
        await expect(current).to_contain_text("current")
        await current.get_by_role("button").click()
        await expect(tab.by("file-is-current")).to_be_visible()  # nothing to make current again
        await expect(tab.by("file-rollback")).to_have_count(0)
        tab.assert_clean()


async def test_sign_out_leaves_no_memory_draft_search_nor_version_request_for_the_next_person(server: SpriteOS) -> None:
    """A tab is shared: after Sign out the next person signs in on the same page. The memory view kept
    the one who left: their draft of a file (in its editor, and one set aside while they looked at
    another file), shown again by the next person's first look at the file, where Save would write it;
    their learnings search; and a version they asked for, whose ending by Sign out was an unhandled
    rejection (a console error)."""
    install_templates(server.settings)
    files = MemoryFiles(server.settings.layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="seed")
    files.write("context.md", "# Context\n- The garden\n", source="seed")
    drafts = {"user.md": "# User\n- Name: Ada\n- Left unsaved, mine\n", "context.md": "# Context\n- Drafted, set aside\n"}
    held = Held('"memory_version_result"')  # once on, a version's answer never comes
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=held.route)
        await tab.memory("files")
        for name in ("context.md", "user.md"):  # context.md's draft set aside, user.md's in the editor
            await tab.by("memory-file").filter(has_text=name).get_by_role("button").click()
            await expect(tab.page.locator(".file-detail h2")).to_have_text(name)
            await tab.by("file-edit").click()
            await tab.by("file-editor").fill(drafts[name])
        await tab.memory("learnings")
        await tab.by("learning-search").fill("my private words")
        await tab.by("learning-search-button").click()
        await expect(tab.by("memory-panel-learnings")).to_contain_text("my private words")
        await tab.memory("files")
        held.on = True
        await tab.by("file-version").first.get_by_role("button").click()  # asked, not answered
        await tab.by("sign-out").click()
        held.on = False
        typed = await tab.page.evaluate("[...document.querySelectorAll('#app textarea')].map((e) => e.value)")
        assert [t for t in typed if "mine" in t or "set aside" in t] == []  # no draft stays in the page

        await tab.by("token-input").fill(TOKEN)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        await tab.memory("files")
        for name, text in (("user.md", "# User\n- Name: Ada\n"), ("context.md", "# Context\n- The garden\n")):
            await tab.by("memory-file").filter(has_text=name).get_by_role("button").click()
            await expect(tab.by("file-text")).to_have_text(text)  # the file, not the draft
            await expect(tab.by("file-editor")).to_have_count(0)
        await tab.memory("learnings")
        await expect(tab.by("learning-search")).to_have_value("")  # their search neither shown nor asked again
        await expect(tab.by("memory-panel-learnings")).not_to_contain_text("my private words")
        await expect(tab.by("memory-flash")).to_have_text("")
        tab.assert_clean()  # the version's request Sign out ended: said nowhere, nor thrown


class Dropping:
    """Passes the page's sockets through; `drop` ends the open ones as a lost link does."""

    def __init__(self) -> None:
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        self.sockets.append(page_side)
        page_side.connect_to_server()

    async def drop(self) -> None:
        for page_side in self.sockets:
            await page_side.close(code=4000, reason="the link lost")
        self.sockets.clear()


async def test_a_sign_in_after_a_refused_token_starts_on_the_chat(server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token refused (a new one provisioned) while the person was on Memory: signing in again showed
    Memory at once, asking the Sprite before the new socket was open ("Not connected"), where a sign-in
    after Sign out starts on the chat."""
    link = Dropping()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        await tab.memory("files")
        monkeypatch.setattr(server, "_token", b"a-new-token-for-this-sprite")  # provisioned anew meanwhile
        await link.drop()  # the page reconnects, and its token is refused
        await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
        await tab.by("token-input").fill("a-new-token-for-this-sprite")  # in the same page
        await tab.by("token-submit").click()
        await expect(tab.page.locator("body")).to_have_attribute("data-view", "chat")
        await tab.connected()
        await tab.memory("files")
        await expect(tab.by("memory-flash")).to_have_text("")
        await expect(tab.by("memory-file")).not_to_have_count(0)
        tab.assert_clean("HTTP Authentication failed", "401")
