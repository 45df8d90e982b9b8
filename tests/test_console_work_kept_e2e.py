"""Work a person has begun is not thrown away, nor applied to the wrong item, by the page: a memory
file's draft kept while they look at another file, a version's answer that comes late never shown
in (nor rolled back from) another file's view, and a message still waiting for the agent when the
server restarted kept with a Send again, not wiped from the conversation. Real Chromium, real server
and CLI, the mock Bridge."""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Locator, WebSocketRoute, expect

from devkit.harness import Restartable, restartable
from devkit.mock_bridge import Fault, MockBridge
from sprite_os.config import Settings
from sprite_os.memory.capture.journal import STOPPED_NOTE
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.protocol import MAX_QUEUED_MESSAGES, MAX_USER_TEXT
from sprite_os.server import SpriteOS
from tests.conftest import client_factory, wait_for
from tests.console_browser import (
    HeldFrames,
    HoldBack,
    Scenario,
    Tab,
    chromium,
    install_templates,
    one_server_tests,
    open_tab,
    refused,
    signed_in,
)

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def editing_user_md(server: SpriteOS) -> AsyncIterator[tuple[Tab, MemoryFiles]]:
    """A tab on the memory files, user.md's editor open."""
    install_templates(server.settings)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.memory("files")
        await tab.by("file-edit").click()
        yield tab, MemoryFiles(server.settings.layout)


async def test_a_draft_is_kept_while_the_person_looks_at_another_file(server: SpriteOS) -> None:
    install_templates(server.settings)
    files = MemoryFiles(server.settings.layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="seed")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.memory("files")
        await tab.by("file-edit").click()
        draft = "# User\n- Name: Ada\n- Half a thought about"
        await tab.by("file-editor").fill(draft)
        await tab.by("memory-file").filter(has_text="context.md").get_by_role("button").click()
        await expect(tab.page.locator(".file-detail h2")).to_have_text("context.md")
        await expect(tab.by("file-editor")).to_have_count(0)  # another file, shown as it is
        await tab.by("memory-file").filter(has_text="user.md").get_by_role("button").click()
        await expect(tab.by("file-editor")).to_have_value(draft)  # back to the draft, not the saved text
        await expect(tab.by("file-save")).to_be_enabled()

        files.write("user.md", "# User\n- Name: Ada\n- Likes jazz\n", source="batch-9")  # the daemon, while away
        await tab.by("memory-file").filter(has_text="tools.md").get_by_role("button").click()
        await expect(tab.page.locator(".file-detail h2")).to_have_text("tools.md")
        await tab.by("memory-file").filter(has_text="user.md").get_by_role("button").click()
        await expect(tab.by("file-editor")).to_have_value(draft)
        await expect(tab.by("memory-flash")).to_contain_text("changed since you began editing: your draft is kept")
        await tab.by("file-save").click()  # against the text it began from: refused, never over the daemon's
        await expect(tab.by("memory-flash")).to_contain_text("nothing was saved")
        assert files.read("user.md") == "# User\n- Name: Ada\n- Likes jazz\n"
        await tab.by("file-cancel").click()  # the draft is let go: the file as it is now
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n- Likes jazz\n")
        await tab.by("memory-file").filter(has_text="tools.md").get_by_role("button").click()
        await tab.by("memory-file").filter(has_text="user.md").get_by_role("button").click()
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n- Likes jazz\n")  # not back
        tab.assert_clean()




async def test_a_version_asked_for_one_file_never_lands_in_another_files_view(server: SpriteOS) -> None:
    """Its answer held until the person has gone to another file: that file's view must not show the
    diff, nor a "Make version 2 current again" that would roll the other file back."""
    install_templates(server.settings)
    files = MemoryFiles(server.settings.layout)
    for name in ("user.md", "context.md"):
        files.write(name, f"# {name} one\n", source="seed")
        files.write(name, f"# {name} two\n", source="batch-1")
    late = HoldBack()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=late.route)
        await tab.memory("files")
        await expect(tab.page.locator(".file-detail h2")).to_have_text("user.md")
        seed = tab.by("file-version").filter(has_text="#2").get_by_role("button")
        await late.hold("memory_version_result", seed.click())
        await tab.by("memory-file").filter(has_text="context.md").get_by_role("button").click()
        await expect(tab.page.locator(".file-detail h2")).to_have_text("context.md")
        late.release()  # the late answer arrives, then the health tab's, in order on the socket
        await tab.by("memory-section-health").click()  # not the Memory tab: it would load the files again
        await expect(tab.by("memory-state")).to_be_attached()
        files_panel = tab.by("memory-panel-files")
        await expect(files_panel.locator(".file-detail h2")).to_have_text("context.md")
        await expect(files_panel.get_by_test_id("file-diff")).to_have_count(0)  # user.md's diff is not here
        await expect(files_panel.get_by_test_id("file-rollback")).to_have_count(0)  # nor a rollback of it
        assert files.read("context.md") == "# context.md two\n"
        tab.assert_clean()


async def test_a_memory_sections_older_answer_or_failure_says_nothing_over_a_newer_one(server: SpriteOS) -> None:
    """Refresh clicked twice on Health or Boot prompt, the first answer slow: it came after the second and
    was drawn over it, the older state left on screen (here the older answer made to differ, as the
    memory it told of did). Failing late (Files' Refresh, the learnings' own Search), its error was said
    over the newest answer, or under another section shown meanwhile."""
    install_templates(server.settings)
    late = HoldBack()
    stale = "What an older answer said"

    def failed(frame: dict[str, Any]) -> None:
        kept = frame["request_id"]
        frame.clear()
        frame.update(type="error", request_id=kept, code="internal", message=stale)

    def made_older(make_older: Callable[[dict[str, Any]], None]) -> None:
        frame = json.loads(late.held[0])
        make_older(frame)
        late.held[0] = json.dumps(frame)

    older = {  # a section, its answer that is held, how it is made older, and where it would be drawn
        "boot": ("memory_boot_prompt_result", lambda f: f.update(text=stale), "boot-prompt"),
        "health": ("memory_health_result", lambda f: f["health"].update(last_error=stale), "memory-state"),
        "files": ("memory_files_result", failed, None),  # said, if anywhere, in the view's notice
        "learnings": ("memory_search_result", failed, None),  # asked again by its own Search, not Refresh
    }
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=late.route)
        await tab.page.evaluate("""() => {  // every text the memory view's notice shows, however briefly
            window.said = [];
            const flash = document.querySelector('[data-testid="memory-flash"]');
            new MutationObserver(() => window.said.push(flash.textContent)).observe(flash, {childList: true, characterData: true, subtree: true});
        }""")
        for section, (kind, make_older, drawn) in older.items():
            await tab.memory(section)
            again = tab.by("learning-search-button" if section == "learnings" else "memory-refresh")
            await late.hold(kind, again.click())
            await again.click()  # a second load, answered at once (the first is older from its asking on)
            await expect(tab.by(f"memory-panel-{section}")).not_to_have_attribute("data-loading", "true")
            newest = await tab.by(drawn).text_content() if drawn else None
            made_older(make_older)
            await tab.page.evaluate("window.said = []")
            late.release()  # the late answer arrives, then the learnings', in order on the socket
            await tab.by("memory-section-learnings").click()  # not the Memory tab: it would load the section again
            await expect(tab.by("memory-panel-learnings")).not_to_have_attribute("data-loading", "true")
            if drawn:
                assert await tab.by(drawn).text_content() == newest
                assert stale not in (newest or "")
            assert not [text for text in await tab.page.evaluate("window.said") if stale in text]
        # A search of the learnings' own, failing once another section is shown: said under none
        await late.hold("memory_search_result", tab.by("learning-search-button").click())
        await tab.by("memory-section-health").click()
        await expect(tab.by("memory-panel-health")).not_to_have_attribute("data-loading", "true")
        made_older(failed)
        await tab.page.evaluate("window.said = []")
        late.release()
        await tab.by("memory-section-boot").click()  # its answer comes after the failure
        await expect(tab.by("memory-panel-boot")).not_to_have_attribute("data-loading", "true")
        assert not [text for text in await tab.page.evaluate("window.said") if stale in text]
        tab.assert_clean()


async def restarted_twice(scenario: Scenario, settings: Settings, bridge: MockBridge) -> None:
    """A message waits behind a turn that hangs; the server restarts, and again, before the person
    presses its Send again; then they do. The two tests below read this one run."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the first turn hangs
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.send("First, the slow one")
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 1)  # out to the model, and held there
        await tab.send("Second, still waiting")
        waiting = tab.messages("user").filter(has_text="Second, still waiting")
        await expect(waiting).to_have_attribute("data-state", "queued")  # the page's own state, at once
        # ...and the server's: a stop before its frame arrives refuses it (`shutting_down`), rightly, which is
        # another test's (a loaded machine's frame came after the stop began).
        await wait_for(lambda: server.app is not None and server.app.runtime.queued == 1, timeout=30,
                       what="the server holds the waiting message")
        for restart in (1, 2):
            await server.stop()
            await server.start()
            await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
            await tab.connected()
            if restart == 1:
                async with scenario.checks("kept"):
                    restarted = tab.page.locator('[data-kind="reconnected"]').last
                    await expect(restarted).to_contain_text("server restarted")
                    await expect(restarted).to_contain_text("a new session began: the one before is in Past sessions")
                    await expect(waiting).to_have_count(1)  # not wiped with the rest of the view
                    await expect(waiting).to_have_attribute("data-state", "refused")
                    await expect(waiting).to_contain_text("not sent: the Sprite restarted before the agent took it")
            async with scenario.checks("second restart"):
                await expect(tab.page.locator('[data-kind="reconnected"]')).to_have_count(1)  # the view is new each time
                await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
                await expect(waiting).to_have_count(1)  # after each restart
                await expect(waiting.get_by_test_id("send-again")).to_have_count(1)
        await waiting.get_by_test_id("send-again").click()
        for name in ("kept", "second restart"):
            async with scenario.checks(name):
                await expect(tab.messages("assistant").last).to_contain_text("You said: Second, still waiting")
                await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)  # not twice
                assert [r for r in bridge.agent_requests() if "Second, still waiting" in r.last_user_text]
                tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


@pytest.fixture(scope="module")
def restarts(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return Scenario(restarted_twice, tmp_path_factory.mktemp("restarts"), {"kept": 2, "second restart": 3})


@pytest.mark.xdist_group("console-restarted-twice")  # one run: on one worker
async def test_a_message_waiting_when_the_server_restarted_is_kept_with_a_send_again(
        restarts: Scenario) -> None:
    """The server drops the messages queued behind the running turn when it stops; the page must not
    drop them from view too: the person's words stay, said to be unsent, one click from sent."""
    await restarts.verdict("kept")


async def test_a_folder_opened_while_a_listing_was_on_its_way_stays_open(server: SpriteOS) -> None:
    """The Files tab shown again asks for the folder shown; the person opens a folder before that
    answer comes: the late answer must not take them back to the folder they left."""
    (server.settings.layout.root / "documents" / "lease.txt").write_text("The lease ends on 2027-03-31.\n")
    late = HoldBack()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=late.route)
        await tab.by("files-tab").click()
        await expect(tab.by("files-view")).to_have_attribute("data-path", "")
        await late.hold("files_list_result", tab.by("files-tab").click())  # the workspace's listing again
        await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
        await expect(tab.by("files-view")).to_have_attribute("data-path", "documents")
        late.release()  # the late listing of the workspace, then the memory tab's answer
        await tab.by("memory-tab").click()
        await expect(tab.by("memory-panel-files")).not_to_have_attribute("data-loading", "true")
        await expect(tab.by("files-view")).to_have_attribute("data-path", "documents")
        await expect(tab.by("file-entry").filter(has_text="lease.txt")).to_have_count(1)
        tab.assert_clean()


async def test_newest_says_which_load_is_still_the_one_to_draw(server: SpriteOS) -> None:
    """dom.js's `newest()`, which the views above keep their loads by: a load is current until another
    begins, and none begun before Sign out (`forget()`) is, however they end. (What Sign out ends never
    settles, so no view's test can tell a `forget()` that does nothing.)"""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        seen = await tab.page.evaluate("""async () => {
            const { newest } = await import("/console/js/dom.js");
            const loads = newest();
            const first = loads.begin();
            const alone = first();
            const second = loads.begin();
            const both = [first(), second()];
            loads.forget();
            const forgotten = [first(), second()];
            const third = loads.begin();
            return { alone, both, forgotten, after: [second(), third()] };
        }""")
        assert seen == {"alone": True, "both": [False, True], "forgotten": [False, False], "after": [False, True]}
        tab.assert_clean()


EARLIEST = re.compile(r"^Question number 2$")


async def test_show_earlier_turns_still_shows_them_after_a_new_session_began(server: SpriteOS) -> None:
    """The page shows a long session's newest turns, with Show earlier turns; the person starts a new
    session (the old turns stay above): the button must still page back through the session it is in."""
    async with client_factory(server.port) as connect:  # one turn through the agent: a session worth ending
        other = await connect(hello={})
        await other.send(type="user_message", text="Question number 1")
        await other.until("turn_complete")
    session = server.runtime.session_id
    db = TranscriptDB(server.settings.layout.transcript_db)
    try:  # and a long past behind it
        for n in range(2, 37):
            db.append(NewObservation(timestamp=time.time() + n, session_id=session, sequence_num=n,
                                     user_message=f"Question number {n}", tool_calls_json="[]",
                                     agent_response=f"Answer number {n}", status="completed"))
    finally:
        db.close()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await expect(tab.messages("user").filter(has_text="Question number 36")).to_have_count(1)
        await expect(tab.messages("user")).to_have_count(30)  # a page of them
        await tab.by("new-session").click()
        await expect(tab.by("notice").filter(has_text="A new session started")).to_have_count(1)
        await tab.by("load-earlier").click()
        await expect(tab.messages("user").filter(has_text=EARLIEST)).to_have_count(1)
        await expect(tab.messages("user")).to_have_count(36)
        await expect(tab.by("load-earlier")).to_have_count(0)  # all shown
        tab.assert_clean()


async def test_a_show_more_button_clicked_twice_shows_its_page_once(server: SpriteOS) -> None:
    """"Show older sessions" and a past session's "Show earlier turns" clicked twice before the answer
    came (a double click) asked for the same page twice, and showed it twice."""
    db = TranscriptDB(server.settings.layout.transcript_db)
    try:
        for n in range(25):  # a page of 20 sessions, then 5 older; the newest has 45 turns
            for k in range(45 if n == 24 else 1):
                db.append(NewObservation(timestamp=time.time() - 3600 + n * 60 + k / 10, session_id=f"past-{n:02d}",
                                         sequence_num=k + 1, user_message=f"Session {n} question {k}",
                                         tool_calls_json="[]", agent_response=f"Answer {k}", status="completed"))
    finally:
        db.close()
    # Both clicks in one go, so no answer comes between them; each click's request is sent within it
    # (counted as the page sends it), so what the two clicks asked is known as soon as they return.
    twice = """(testid) => {
      const b = document.querySelector(`[data-testid=${testid}]`);
      window.asked = [];
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) { window.asked.push(JSON.parse(data).type); return send.call(this, data); };
      b.click(); b.click();
      WebSocket.prototype.send = send;
      // Deaf to clicks, saying so, and still focusable (a disabled button loses the keyboard's focus).
      return [window.asked, b.getAttribute("aria-disabled"), b.textContent, b.disabled];
    }"""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("past-sessions").click()
        await expect(tab.by("past-session")).to_have_count(20)
        assert await tab.page.evaluate(twice, "sessions-more") == [["sessions"], "true", "Loading…", False]
        await expect(tab.by("past-session")).to_have_count(25)
        await expect(tab.by("sessions-more")).to_have_count(0)
        await tab.by("past-session").filter(has_text="Session 24 question 0").get_by_role("button").click()
        turns = tab.by("past-turns").locator('[data-testid="message"][data-role="user"]')
        await expect(turns).to_have_count(20)
        assert await tab.page.evaluate(twice, "load-earlier") == [["session_turns"], "true", "Loading…", False]
        await expect(turns).to_have_count(40)
        await tab.page.evaluate(twice, "load-earlier")  # the last page: once more, twice
        await expect(turns).to_have_count(45)
        await expect(tab.by("load-earlier")).to_have_count(0)
        ids = await tab.by("past-turns").locator('[data-testid="message"][data-role="user"]').all_inner_texts()
        assert len(set(ids)) == 45, ids
        tab.assert_clean()


def past_sessions(server: SpriteOS) -> None:
    """25 past sessions of a turn each: a page of 20, and "Show older sessions" for the 5 older."""
    db = TranscriptDB(server.settings.layout.transcript_db)
    try:
        for n in range(25):
            db.append(NewObservation(timestamp=time.time() - 3600 + n * 60, session_id=f"past-{n:02d}", sequence_num=1,
                                     user_message=f"Session {n}", tool_calls_json="[]", agent_response="An answer",
                                     status="completed"))
    finally:
        db.close()


async def test_a_show_more_button_whose_page_throws_can_be_clicked_again(server: SpriteOS) -> None:
    """A page that came but could not be drawn (here an answer without its sessions: the view throws
    rather than settling falsy) left "Show older sessions" at "Loading…", deaf to clicks, for good."""
    past_sessions(server)
    garbled = [True]

    def route(page_side: WebSocketRoute) -> None:  # the older page answered without its sessions, once
        server_side = page_side.connect_to_server()

        def to_server(message: str | bytes) -> None:
            frame = json.loads(message) if isinstance(message, str) else {}
            if frame.get("type") == "sessions" and "before" in frame and garbled:
                garbled.clear()
                page_side.send(json.dumps({"type": "sessions_result", "request_id": frame["request_id"]}))
                return
            server_side.send(message)
        page_side.on_message(to_server)

    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=route)
        await tab.by("past-sessions").click()
        await expect(tab.by("past-session")).to_have_count(20)
        more = tab.by("sessions-more")
        await more.click()
        await expect(more).to_have_text("Show older sessions")  # itself again, and takes a click
        await expect(more).not_to_have_attribute("aria-disabled", "true")
        assert not garbled
        await more.click()
        await expect(tab.by("past-session")).to_have_count(25)
        await expect(more).to_have_count(0)
        tab.assert_clean("Cannot read properties of undefined")  # the view's throw, reported as ever


async def test_older_sessions_asked_before_the_panel_was_shown_again_go_to_no_list(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """Show older sessions on a slow link, then the panel closed and opened again: the older page came
    into the new list, above its first page, and the next Show older sessions brought it again."""
    past_sessions(server)
    # A slow link: the older page's answer comes after the panel is shown again.
    older = HeldFrames(monkeypatch, lambda frame: '"sessions"' in frame and '"before"' in frame)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("past-sessions").click()
        await expect(tab.by("past-session")).to_have_count(20)
        await tab.by("sessions-more").click()
        await expect(tab.by("sessions-more")).to_have_text("Loading…")
        await tab.page.keyboard.press("Escape")
        await tab.by("past-sessions").click()  # shown again: a list of its own, its first page
        await expect(tab.by("past-session")).to_have_count(20)
        older.on = False
        await older.release()  # the first older page answered, into no list
        await tab.by("sessions-more").click()  # the new list's own older page
        await expect(tab.by("past-session")).to_have_count(25)
        await expect(tab.by("sessions-more")).to_have_count(0)
        ids = await tab.by("past-session").evaluate_all("(items) => items.map((i) => i.dataset.sessionId)")
        assert len(ids) == len(set(ids)) == 25, ids
        tab.assert_clean()


async def test_a_forget_refused_says_why_and_offers_forget_again(server: SpriteOS, bridge: MockBridge) -> None:
    """Forgetting a turn of the session while its next turn runs is refused (busy): the page says so,
    and the turn's Forget is there again for when the turn is done, not stuck on "forgetting…"."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.send("The first thing")
        await expect(tab.by("turn-status")).to_have_count(1)
        bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))
        await tab.send("The second thing, slow")
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 2)  # running: out to the model
        first = tab.by("turn-status").first
        await first.get_by_test_id("forget-turn").click()
        await first.get_by_test_id("forget-confirm").click()
        await expect(tab.by("notice").filter(has_text="Not forgotten: a turn is running")).to_have_count(1)
        await expect(first.get_by_test_id("forget-turn")).to_be_visible()  # offered again
        await expect(first).not_to_contain_text("forgetting…")
        await tab.by("interrupt").click()
        await expect(tab.by("turn-status")).to_have_count(2)
        await first.get_by_test_id("forget-turn").click()
        await first.get_by_test_id("forget-confirm").click()
        await expect(tab.by("tombstone")).to_have_count(1)  # now it is forgotten
        tab.assert_clean()


async def test_a_draft_over_a_memory_files_limits_says_what_to_cut(server: SpriteOS) -> None:
    """Save is off past a file's limits: the page says by how much, in lines or in bytes, not only
    with a red number (a line limit alone let a 24,000-byte overrun go to the server)."""
    async with editing_user_md(server) as (tab, _files):
        counter = tab.by("file-counter")
        await tab.by("file-editor").fill("- a line\n" * 203)
        await expect(counter).to_have_text("203 / 200 lines, over the limit: remove 3 lines to save")
        await expect(tab.by("file-save")).to_be_disabled()
        await tab.by("file-editor").fill("x" * 24_010)  # one line, past the bytes (and the final newline it gets)
        await expect(counter).to_contain_text("24,011 / 24,000 bytes, over the limit: shorten it by 11 bytes to save")
        await expect(tab.by("file-save")).to_be_disabled()
        await tab.by("file-editor").fill("- fits\n")
        await expect(counter).to_have_text("1 / 200 lines")
        await expect(tab.by("file-save")).to_be_enabled()
        tab.assert_clean()


async def test_the_counter_counts_the_bytes_the_server_will_store(server: SpriteOS) -> None:
    """The server stores a draft with a final newline (and without control characters): a draft of
    exactly 24,000 bytes and no final newline is 24,001 bytes on disk, refused. The page must say so
    before Save, not offer a Save the server refuses; and a control character it drops is not counted."""
    async with editing_user_md(server) as (tab, files):
        counter = tab.by("file-counter")
        await tab.by("file-editor").fill("x" * 24_000)  # no final newline: the server adds one
        await expect(counter).to_contain_text("24,001 / 24,000 bytes, over the limit: shorten it by 1 byte to save")
        await expect(tab.by("file-save")).to_be_disabled()
        await tab.by("file-editor").fill("x" * 23_999 + "\x07\n")  # 24,001 typed; the bell is dropped: 24,000 stored
        await expect(counter).to_have_text("1 / 200 lines")
        await tab.by("file-save").click()
        await expect(tab.by("memory-flash")).to_contain_text("Saved user.md")
        assert files.read("user.md") == "x" * 23_999 + "\n"
        tab.assert_clean()


async def test_a_save_pressed_twice_saves_once_and_says_saved(server: SpriteOS) -> None:
    """Save pressed twice before its answer (a double click, an impatient Enter): the second request
    began from the same text as the first, so the server refuses it as "changed since you began
    editing", and the page said the person's own save was someone else's. Save waits for its answer."""
    async with editing_user_md(server) as (tab, files):
        await tab.by("file-editor").fill("# User\n- Name: Ada\n")
        await tab.by("file-save").dblclick()
        await expect(tab.by("file-text")).to_have_text("# User\n- Name: Ada\n")
        await expect(tab.by("memory-flash")).to_contain_text("Saved user.md")
        await tab.by("memory-section-health").click()  # every answer in: the flash is the last word
        await expect(tab.by("memory-state")).to_be_attached()
        await expect(tab.by("memory-flash")).not_to_contain_text("changed since you began editing")
        assert [v.source for v in files.history("user.md")].count("person-edit") == 1
        tab.assert_clean()


class Muted:
    """Sits on the page's sockets: while `on`, nothing the server sends reaches the page (a link gone
    dead under a phone in a tunnel), while what the page sends still goes out."""

    def __init__(self) -> None:
        self.on = False

    def route(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()
        server_side.on_message(lambda message: None if self.on else page_side.send(message))


async def restart_unheard(server: Restartable, muted: Muted, tab: Tab) -> None:
    """The server restarts while `tab`'s link is dead; the link comes back, and the page's view is
    rebuilt from the record."""
    await server.stop()
    muted.on = False
    await server.start()
    await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
    await tab.connected()
    await expect(tab.page.locator('[data-kind="reconnected"]').last).to_contain_text("server restarted")
    await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)


TAKEN = ["Taken after all", "Taken after all, my pin is <private>1234</private>"]


async def taken_unheard(scenario: Scenario, settings: Settings, bridge: MockBridge) -> None:
    """Two pages send a message each, their links dead: the agent takes both, answering the one with
    private words, and is still thinking over the other (its model slow) when the server restarts. Each
    page reconnects and its view is rebuilt from the record. The three tests below read this one run."""
    private, plain = Muted(), Muted()
    async with restartable(settings) as server, chromium() as browser:
        app = server.app
        assert app is not None
        tabs = {TAKEN[1]: await signed_in(browser, server.port, route=private.route),
                TAKEN[0]: await signed_in(browser, server.port, route=plain.route)}
        private.on = True
        await tabs[TAKEN[1]].send(TAKEN[1])
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 1)
        await wait_for(lambda: app.runtime.state == "idle", timeout=30, what="its turn's end")  # taken, and answered
        bridge.faults.add(Fault("latency", seconds=30, target="agent", times=1))
        plain.on = True
        await tabs[TAKEN[0]].send(TAKEN[0])
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 2)  # taken, the model still thinking
        await server.stop()
        private.on = plain.on = False
        await server.start()
        for tab in tabs.values():
            await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        for text, tab in tabs.items():
            async with scenario.checks(text):
                await tab.connected()
                await expect(tab.page.locator('[data-kind="reconnected"]').last).to_contain_text("server restarted")
                await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
                taken = tab.messages("user").filter(has_text="Taken after all")
                await expect(taken).to_have_attribute("data-state", "taken")  # settled: the old session's record was asked
                await expect(taken).to_contain_text("in Past sessions")  # its answer, or its turn cut short by the stop
                await expect(taken.get_by_test_id("send-again")).to_have_count(0)
                tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")
        async with scenario.checks("cut short"):
            await expect(tabs[TAKEN[0]].messages("user").filter(has_text="Taken after all")).to_contain_text(
                "the restart cut its turn short")
            transcript = TranscriptDB(settings.layout.transcript_db)
            try:
                [turn] = [o for o in transcript.iter_all() if o.user_message == TAKEN[0]]
            finally:
                transcript.close()
            assert turn.status == "stopped" and turn.agent_response.endswith(STOPPED_NOTE)


@pytest.fixture(scope="module")
def taken(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return Scenario(taken_unheard, tmp_path_factory.mktemp("taken"), {**dict.fromkeys(TAKEN, 1), "cut short": 1})


@pytest.mark.xdist_group("console-taken-unheard")  # one run: on one worker
@pytest.mark.parametrize("text", TAKEN)
async def test_a_message_the_agent_took_before_a_restart_is_not_offered_to_send_again(
        taken: Scenario, text: str) -> None:
    """The message went out and the agent took it, but the page heard nothing of it (its link went
    dead) before the server restarted: it must not say the agent never took it, nor offer a Send
    again that puts the same message to the agent a second time. The record keeps a message's
    private words out ("[private]" in their place): it is found by its client id all the same."""
    await taken.verdict(text)


NOT_COMPLETED = {
    "error": "its turn did not finish",  # it failed (the model unreachable, the CLI dead) before the restart
    "interrupted": "its turn did not finish",  # another device's Stop
    "stopped": "the restart cut its turn short",  # the stop, or a kill and the journal's replay
}


async def taken_not_completed(scenario: Scenario, settings: Settings, bridge: MockBridge) -> None:
    """A page for each way a turn ends short of complete, their links dead, each sending a message that
    waits behind a script's turn; the server stops, and the old server's record is made to hold each
    page's message as taken, its turn ended that way (its client id, the page's); one restart for all."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the script's turn hangs
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser, client_factory(server.port) as connect:
        tabs = [await signed_in(browser, server.port, route=muted.route) for _status in NOT_COMPLETED]
        muted.on = True
        other = await connect(hello={})
        await other.send(type="user_message", text="Hello from a script", client_id="script-1")
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 1)
        app = server.app
        assert app is not None
        for queued, tab in enumerate(tabs, 1):
            await tab.send("Not completed")
            await wait_for(lambda: app.runtime.queued == queued, timeout=30,  # noqa: B023 - awaited here
                           what="the page's message queued")
        items = [tab.messages("user").filter(has_text="Not completed") for tab in tabs]
        client_ids = [await item.get_attribute("data-client-id") for item in items]
        session = app.runtime.session_id
        await server.stop()
        # What the old server's record holds of each page's message, had it been taken, its turn not completed.
        db = TranscriptDB(settings.layout.transcript_db)
        try:
            for n, (status, client_id) in enumerate(zip(NOT_COMPLETED, client_ids, strict=True)):
                db.append(NewObservation(
                    timestamp=time.time() + n, session_id=session, sequence_num=2 + n, user_message="Not completed",
                    tool_calls_json="[]", agent_response="Working on it",
                    turn_id=f"cut0turn000{n + 1}", status=status, client_id=client_id))
        finally:
            db.close()
        muted.on = False
        await server.start()
        for tab in tabs:
            await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        for (status, said), tab, item in zip(NOT_COMPLETED.items(), tabs, items, strict=True):
            async with scenario.checks(status):
                await tab.connected()
                await expect(item).to_have_attribute("data-state", "taken")
                await expect(item).to_contain_text(said)
                await expect(item).not_to_contain_text("its answer is in Past sessions")
                await expect(item.get_by_test_id("send-again")).to_have_count(0)
                tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


@pytest.fixture(scope="module")
def not_completed(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return Scenario(taken_not_completed, tmp_path_factory.mktemp("not-completed"), dict.fromkeys(NOT_COMPLETED, 1))


@pytest.mark.xdist_group("console-taken-not-completed")  # one run: on one worker
@pytest.mark.parametrize("status", NOT_COMPLETED)
async def test_a_taken_message_whose_turn_did_not_complete_is_not_said_answered(
        not_completed: Scenario, status: str) -> None:
    """The page's message was taken, its link dead, and its turn did not complete before the server
    restarted. The page said "its answer is in Past sessions" for every status but the stop's, and
    the person took a failed or stopped task as done."""
    await not_completed.verdict(status)


async def test_a_taken_message_behind_a_page_of_other_turns_is_not_called_unsent(
        settings: Settings, bridge: MockBridge) -> None:
    """The page's message was taken, its link dead, and another device then had more turns than the
    restart check asks for (a page of 30) before the server restarted. The check saw only those, each
    with the other device's id, and said "not sent": Send again would give the agent the message twice."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the page's turn hangs
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=muted.route)
        muted.on = True
        await tab.send("Taken long before")
        await bridge.wait_for(lambda b: any("Taken long before" in r.last_user_text for r in b.agent_requests()))
        session = server.app.runtime.session_id
        await server.stop()  # its turn is recorded, cut short, as turn 1
        db = TranscriptDB(settings.layout.transcript_db)
        for n in range(2, 133):  # what the laptop had the agent do after it (as the old server recorded it)
            db.append(NewObservation(timestamp=time.time() + n, session_id=session, sequence_num=n,
                                     user_message=f"Laptop {n}", tool_calls_json="[]", agent_response="done",
                                     turn_id=f"laptop{n:06d}", status="completed", client_id=f"laptop-{n}"))
        muted.on = False
        await server.start()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await tab.connected()
        item = tab.messages("user").filter(has_text="Taken long before")
        await expect(item).not_to_have_attribute("data-state", "checking")
        await expect(item).not_to_contain_text("not sent")
        await expect(item).to_have_attribute("data-state", "taken")
        await expect(item.get_by_test_id("send-again")).to_have_count(0)
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


@pytest.mark.xdist_group("console-taken-unheard")  # one run: on one worker
async def test_a_taken_message_whose_turn_the_restart_cut_short_says_so_as_the_record_does(
        taken: Scenario) -> None:
    """The agent took the message, and the server's stop cut its turn short (the model still
    thinking): the record said the person had interrupted it, and the page that its answer is in
    Past sessions. The record says the server stopped it, and the page that the restart cut it short."""
    await taken.verdict("cut short")


async def test_a_turn_the_record_holds_without_a_client_id_leaves_a_dropped_message_unknown(
        settings: Settings, bridge: MockBridge) -> None:
    """Another client, one that sends no client id, had a turn the page never saw; the page's own
    message was dropped with the queue by the restart. That turn could have been the page's message
    for all the record says: the page must not claim it was never sent; it says it does not know, and
    offers Send again."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the other client's turn hangs
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser, client_factory(server.port) as connect:
        tab = await signed_in(browser, server.port, route=muted.route)
        muted.on = True
        other = await connect(hello={})
        await other.send(type="user_message", text="Hello from a script")  # no client_id
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 1)
        await tab.send("Mine, still waiting")
        await wait_for(lambda: server.app.runtime.queued == 1, timeout=30, what="the page's message queued")
        await restart_unheard(server, muted, tab)
        item = tab.messages("user").filter(has_text="Mine, still waiting")
        await expect(item).to_have_attribute("data-state", "refused")
        await expect(item).to_contain_text("this may not have reached the agent")
        await expect(item).not_to_contain_text("not sent")
        await expect(item.get_by_test_id("send-again")).to_have_count(1)
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def test_a_refused_message_is_the_one_the_server_named_not_the_newest(server: SpriteOS, bridge: MockBridge) -> None:
    """The queue was full when one message came, and had room again when the next came: the refusal
    of the first, arriving after the second went out, marked the second (the newest) as refused and
    left the first "waiting for the agent" for ever. The refusal names its message by client id."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=2))  # the first two turns hang
    held = HoldBack()
    async with chromium() as browser, client_factory(server.port) as connect:
        tab = await signed_in(browser, server.port, route=held.route)
        other = await connect(hello={})
        # One runs (and hangs), the rest fill the queue. The first must have left the queue before the rest
        # come: frames read in one go are all queued before the runtime takes the first, and the last was
        # refused as one too many.
        await other.send(type="user_message", text="Filler 0")
        await other.until("turn_started")
        for n in range(1, MAX_QUEUED_MESSAGES + 1):
            await other.send(type="user_message", text=f"Filler {n}")
        await wait_for(lambda: server.runtime.queued == MAX_QUEUED_MESSAGES, timeout=30, what="the queue full")
        await held.hold("queue_full", tab.send("Refused, the queue full"))
        await tab.by("interrupt").click()  # the first turn ends, the next starts (and hangs): a place frees
        await wait_for(lambda: server.runtime.queued == MAX_QUEUED_MESSAGES - 1, timeout=30, what="a place free")
        await tab.send("Accepted, a place free")
        await wait_for(lambda: server.runtime.queued == MAX_QUEUED_MESSAGES, timeout=30, what="it queued")
        held.release()  # the refusal of the first comes only now
        refused = tab.messages("user").filter(has_text="Refused, the queue full")
        await expect(refused).to_have_attribute("data-state", "refused")
        await expect(refused).to_contain_text("not accepted: too many messages are waiting")
        await expect(refused.get_by_test_id("send-again")).to_have_count(1)
        accepted = tab.messages("user").filter(has_text="Accepted, a place free")
        await expect(accepted).to_have_attribute("data-state", "queued")
        await expect(accepted.get_by_test_id("send-again")).to_have_count(0)
        tab.assert_clean()


@pytest.mark.xdist_group("console-restarted-twice")  # one run: on one worker
async def test_an_unsent_message_stays_through_a_second_restart(
        restarts: Scenario) -> None:
    """A message left unsent by one restart, its Send again not pressed yet (the phone in a pocket):
    the next fresh view (another restart, a long gap) must not wipe it, as it wiped nothing else kept."""
    await restarts.verdict("second restart")


class Droppable:
    """Passes the page's socket through, and can cut it (the link lost, the server still up)."""

    def __init__(self) -> None:
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        page_side.connect_to_server()
        self.sockets.append(page_side)

    async def cut(self) -> None:
        await self.sockets[-1].close(code=4000, reason="the link lost")


async def a_message_waiting_through_a_long_gap_stays_in_view_as_the_persons_own(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The page's link is lost for longer than the server keeps events for it (a resync, same server):
    a message still waiting behind a running turn must stay in view, and be the person's own when it starts."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the first turn hangs
    link = Droppable()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        asked = len(bridge.agent_requests())  # the server's earlier parts' (tests/console_browser.py's `on_one_server`)
        await tab.send("First, the slow one")
        await bridge.wait_for(lambda b: len(b.agent_requests()) > asked)
        await tab.send("Second, waiting through the gap")  # its own words: the parts share a session
        waiting = tab.messages("user").filter(has_text="Second, waiting through the gap")
        await expect(waiting).to_have_attribute("data-state", "queued")
        server.hub._evicted_through = server.hub.seq + 1  # what the page missed is no longer kept
        await link.cut()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await expect(tab.page.locator('[data-kind="reconnected"]')).to_contain_text("after a long gap")
        await expect(waiting).to_have_count(1)
        await tab.by("interrupt").click()  # the first turn ends: the second starts
        await expect(tab.messages("assistant").last).to_contain_text("You said: Second, waiting through the gap")
        await expect(waiting).not_to_contain_text("from another")
        tab.assert_clean("WebSocket connection")


@asynccontextmanager
async def phone_and_laptop(settings: Settings, bridge: MockBridge) -> AsyncIterator[tuple[Restartable, Muted, Tab, Tab]]:
    """A phone (its link to be cut, `Muted`) and a laptop on one server, the laptop's first turn hanging."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=2))  # the first two turns hang
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser:
        phone = await signed_in(browser, server.port, route=muted.route)
        laptop = await signed_in(browser, server.port)
        await laptop.send("First, the slow one")
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 1)
        yield server, muted, phone, laptop


async def test_another_devices_message_of_the_same_words_does_not_settle_this_ones_as_taken(
        settings: Settings, bridge: MockBridge) -> None:
    """The laptop's "yes" was taken, the phone's "yes" queued behind it was dropped by the restart; the
    phone heard neither (its link dead). The laptop's turn must not settle the phone's as taken: its
    client id is the laptop's, so the phone knows its own was never sent."""
    async with phone_and_laptop(settings, bridge) as (server, muted, phone, laptop):
        await laptop.send("yes")
        await expect(laptop.messages("user").filter(has_text="yes")).to_have_attribute("data-state", "queued")
        muted.on = True
        await phone.send("yes")
        await wait_for(lambda: server.app.runtime.queued == 2, timeout=30, what="both messages queued")
        await laptop.by("interrupt").click()  # the laptop's "yes" starts, and hangs
        await bridge.wait_for(lambda b: len(b.agent_requests()) >= 2)
        await restart_unheard(server, muted, phone)  # the phone's "yes" is dropped with the queue
        mine = phone.messages("user").filter(has_text="yes")
        await expect(mine).not_to_have_attribute("data-state", "checking")
        await expect(mine).not_to_have_attribute("data-state", "taken")
        await expect(mine).to_contain_text("not sent: the Sprite restarted before the agent took it")
        await expect(mine.get_by_test_id("send-again")).to_have_count(1)


async def test_a_message_taken_in_a_session_the_page_never_heard_of_is_not_offered_to_send_again(
        settings: Settings, bridge: MockBridge) -> None:
    """The laptop began a new session while the phone's link was dead; the phone's message, queued behind
    it, was taken in that session before the restart. The phone knows only the session before: the
    record it asks has no turn of the message, yet the agent took it."""
    async with phone_and_laptop(settings, bridge) as (server, muted, phone, laptop):
        muted.on = True
        await laptop.by("new-session").click()
        await phone.send("Taken in the next session")
        await wait_for(lambda: server.app.runtime.queued == 2, timeout=30, what="the new session and the message queued")
        await laptop.by("interrupt").click()  # the new session begins, and the phone's message starts in it
        await bridge.wait_for(lambda b: any("Taken in the next session" in r.last_user_text for r in b.agent_requests()))
        await restart_unheard(server, muted, phone)
        mine = phone.messages("user").filter(has_text="Taken in the next session")
        await expect(mine).not_to_have_attribute("data-state", "checking")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)


async def pending(tab: Tab) -> str | None:
    """What the tab keeps of its unsettled messages for a reload (None: nothing)."""
    kept: str | None = await tab.page.evaluate("sessionStorage.getItem('sprite-os.pending')")
    return kept


async def one_waiting(tab: Tab, bridge: MockBridge, server: Restartable | None = None,
                      text: str = "Second, still waiting") -> Locator:
    """`tab` sends a message whose turn hangs at the model, then one that waits behind it (`text`): that one.
    With `server` (a test that stops it next), once that server holds it queued: the page marks it
    waiting as it sends, and a stop begun before the frame landed answered it "the Sprite is stopping"."""
    bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))
    asked = len(bridge.agent_requests())  # a server's earlier turns (tests/console_browser.py's `on_one_server`)
    await tab.send("First, the slow one")
    await bridge.wait_for(lambda b: len(b.agent_requests()) > asked)  # out to the model, and held there
    await tab.send(text)
    waiting = tab.messages("user").filter(has_text=text)
    await expect(waiting).to_have_attribute("data-state", "queued")
    if server is not None:
        await wait_for(lambda: server.app is not None and server.app.runtime.queued == 1, timeout=30,
                       what="the second message queued at the server")
    return waiting


def unaware(page_side: WebSocketRoute) -> None:
    """The page's socket, but the server's closing it never reaches the page (a link gone dead)."""
    server_side = page_side.connect_to_server()
    server_side.on_message(page_side.send)
    server_side.on_close(lambda _code, _reason: None)


async def a_message_waiting_behind_a_turn_is_kept_through_a_reload(server: SpriteOS, bridge: MockBridge) -> None:
    """The person reloads the tab while their message waits behind a running turn: it is still there,
    waiting, and once it starts it is their own message (not marked "from another" tab or device), shown once."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        waiting = await one_waiting(tab, bridge)
        assert "Second, still waiting" in (await pending(tab) or "")

        await tab.page.reload()
        await tab.connected()
        await expect(waiting).to_have_count(1)
        await expect(waiting).to_have_attribute("data-state", "queued")
        first = tab.messages("user").filter(has_text="First, the slow one")
        await expect(first).to_have_count(1)  # the running turn, its own message: not from another device
        await expect(first).not_to_contain_text("from another")
        await tab.by("interrupt").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(waiting).to_have_attribute("data-state", "started")
        await expect(waiting).not_to_contain_text("from another")
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)
        assert await pending(tab) is None  # settled: nothing kept

        await tab.page.reload()  # and a reload now shows it once, from the record
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_attribute("data-state", "started")
        tab.assert_clean()


async def test_a_message_a_restart_dropped_is_kept_through_a_reload_and_sent_again_as_it_is(
        settings: Settings, bridge: MockBridge) -> None:
    """The server restarts while a message waits; the person reloads the tab before it is back. The
    message is still there, checked against the record, offered with Send again; and Send again does
    not empty the box when the person's new draft holds the same words."""
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=unaware)
        waiting = await one_waiting(tab, bridge, server)

        await server.stop()  # the page never hears of it: its link looks alive
        await server.start()
        await tab.page.reload()
        await tab.connected()
        await expect(waiting).to_have_count(1)
        await expect(waiting).to_have_attribute("data-state", "refused")
        await expect(waiting).to_contain_text("not sent: the Sprite restarted before the agent took it")
        assert "Second, still waiting" in (await pending(tab) or "")  # still unsent: kept
        await tab.page.reload()  # and through another reload, as it was
        await tab.connected()
        await expect(waiting).to_have_attribute("data-state", "refused")
        await expect(waiting).to_contain_text("not sent: the Sprite restarted before the agent took it")

        await tab.by("composer").fill("Second, still waiting")  # a new draft, the same words
        await waiting.get_by_test_id("send-again").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(tab.by("composer")).to_have_value("Second, still waiting")  # the draft is the person's
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)
        assert await pending(tab) is None
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def test_an_upload_cut_by_a_restart_says_to_pick_the_file_again(settings: Settings, tmp_path: Path) -> None:
    """A restart forgets the uploads under way: the page's next chunk is answered "no such upload",
    which told the person nothing they could do. It says the restart cut it, and to pick the file again."""
    picked = tmp_path / "report.txt"
    picked.write_text("the quarterly report\n" * 100)
    late = HoldBack()
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=late.route)
        await tab.by("files-tab").click()
        await late.hold("upload_chunk_result", tab.by("upload-input").set_input_files(str(picked)))
        await server.stop()  # the chunk's answer never comes: the page asks again, of the new server
        await server.start()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await expect(tab.by("upload").first).to_have_attribute("data-state", "error")
        await expect(tab.by("upload").first).to_contain_text("cut by a restart")
        await expect(tab.by("files-flash")).to_contain_text(
            "report.txt was not uploaded: the Sprite restarted during the upload, which cut it: pick the file again")
        assert not (server.settings.layout.root / "documents" / "report.txt").exists()
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def send_unheard(tab: Tab, muted: Muted, server: SpriteOS, bridge: MockBridge, text: str) -> None:
    """`tab` sends `text` while its link hears nothing back (`muted`); the agent takes it, and its turn ends."""
    muted.on = True
    await tab.send(text)
    await bridge.wait_for(lambda b: any(text in r.last_user_text for r in b.agent_requests()))
    await wait_for(lambda: server.runtime.state == "idle", timeout=30, what="the turn's end")


async def a_message_sent_while_the_link_was_dead_is_shown_once_after_a_reload(
        server: SpriteOS, bridge: MockBridge) -> None:
    """Sent while the page heard nothing back, and taken: after a reload the record shows its turn,
    and the message kept for the reload is settled by it (its client id), not shown a second time."""
    muted = Muted()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=muted.route)
        await send_unheard(tab, muted, server, bridge, "Taken while unheard")
        assert "Taken while unheard" in (await pending(tab) or "")  # the page never heard it start
        muted.on = False
        await tab.page.reload()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.messages("assistant").last).to_contain_text("You said: Taken while unheard")
        mine = tab.messages("user").filter(has_text="Taken while unheard")
        await expect(mine).to_have_count(1)
        await expect(mine).to_have_attribute("data-state", "started")
        await expect(tab.by("send-again")).to_have_count(0)
        await tab.page.wait_for_function("sessionStorage.getItem('sprite-os.pending') === null")  # settled
        tab.assert_clean()


async def test_a_message_taken_unheard_before_a_new_session_is_not_offered_again_after_a_reload(
        server: SpriteOS, bridge: MockBridge) -> None:
    """Sent while the page heard nothing back, taken, and then a new session began (another device's
    New session, a crash, the idle timeout) before the person reloaded: the reloaded page's record of
    the current session does not hold it, but the session it was sent in does. It is found there, not
    offered with a Send again that would give the agent the same message twice."""
    muted = Muted()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=muted.route)
        other = await signed_in(browser, server.port)
        muted.on = True
        await tab.send("Taken, then a new session")
        await bridge.wait_for(lambda b: any("Taken, then a new session" in r.last_user_text for r in b.agent_requests()))
        await wait_for(lambda: server.runtime.state == "idle", timeout=30, what="the turn's end")
        sent_in = server.runtime.session_id
        await other.by("new-session").click()
        await wait_for(lambda: server.runtime.session_id != sent_in, timeout=30, what="the new session")
        muted.on = False
        await tab.page.reload()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.page.locator('[data-state="checking"]')).to_have_count(0)  # settled
        await expect(tab.by("send-again")).to_have_count(0)
        mine = tab.messages("user").filter(has_text="Taken, then a new session")
        await expect(mine).to_have_attribute("data-state", "taken")
        await expect(mine).to_contain_text("the agent took it in a session that has ended since")
        assert await pending(tab) is None
        tab.assert_clean()


async def signing_out_leaves_no_unanswered_message_in_the_tab(server: SpriteOS, bridge: MockBridge) -> None:
    """Sign out takes the person's words out of the tab's storage (the draft already): the messages
    kept for a reload too, so the next person to sign in on this tab is not shown them."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await one_waiting(tab, bridge, text="Waiting as they sign out")  # its own words: a shared session
        assert "Waiting as they sign out" in (await pending(tab) or "")
        await tab.by("sign-out").click()
        assert await pending(tab) is None
        await tab.page.reload()  # the login again: nothing of theirs comes back once someone signs in
        await tab.sign_in()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.by("send-again")).to_have_count(0)
        await expect(tab.messages("user").filter(has_text="Waiting as they sign out")).to_have_count(0)
        tab.assert_clean()


async def test_send_again_with_the_tab_storage_full_is_sent_once(settings: Settings, bridge: MockBridge) -> None:
    """The tab's storage is full (a long draft, other pages' keys): keeping the unsettled messages fails.
    Send again must still send once and leave the message settled, not throw half way and leave the
    same Send again under a message the agent has taken."""
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=unaware)
        waiting = await one_waiting(tab, bridge, server)
        await server.stop()
        await server.start()
        await tab.page.reload()
        await tab.connected()
        await expect(waiting).to_have_attribute("data-state", "refused")
        await tab.page.evaluate("""() => {
          const chunk = 'x'.repeat(256 * 1024);
          for (let i = 0; ; i++) { try { sessionStorage.setItem('filler' + i, chunk); } catch { break; } }
          for (let i = 0; ; i++) { try { sessionStorage.setItem('small' + i, 'x'.repeat(64)); } catch { break; } }
        }""")
        await waiting.get_by_test_id("send-again").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)
        await expect(tab.by("send-again")).to_have_count(0)
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


class Lossy:
    """Passes the page's socket through; while `deaf`, what the page sends is lost on the way (the link
    died under it and the page does not know yet); and it can cut the link."""

    def __init__(self) -> None:
        self.deaf = False
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()
        page_side.on_message(lambda message: None if self.deaf else server_side.send(message))
        self.sockets.append(page_side)

    async def cut(self) -> None:
        await self.sockets[-1].close(code=4000, reason="the link lost")


@asynccontextmanager
async def earlier_turns_asked_as_the_link_reopens(server: SpriteOS, frames: HeldFrames) -> AsyncIterator[Tab]:
    """A session of 36 turns shown (its newest 30), the link lost for a long gap, and Show earlier turns
    clicked on the new socket before its `ready`: `frames` (holding each page of turns and the hello, off
    until now) holds the hello, then the earlier page. Its release 0 lets `ready` through, a fresh snapshot
    (the gap too long) that rebuilds the list and asks for its newest turns (held 2)."""
    session = server.runtime.session_id  # the session the page shows, before its first turn
    db = TranscriptDB(server.settings.layout.transcript_db)
    try:
        for n in range(1, 37):
            db.append(NewObservation(timestamp=time.time() - 3600 + n, session_id=session, sequence_num=n,
                                     user_message=f"Question number {n}", tool_calls_json="[]",
                                     agent_response=f"Answer number {n}", status="completed"))
    finally:
        db.close()
    held = frames.held
    link = Droppable()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        await expect(tab.messages("user")).to_have_count(30)
        frames.on = True
        server.hub._evicted_through = server.hub.seq + 1  # what the page missed is no longer kept
        await link.cut()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await wait_for(lambda: len(held) == 1, timeout=30, what="the new socket's hello")
        await tab.by("load-earlier").click()  # on the new socket, before its `ready`
        await wait_for(lambda: len(held) == 2, timeout=30, what="the earlier page asked")
        await frames.release(0)  # `ready`: a fresh snapshot (the gap too long), which asks for the newest turns
        await expect(tab.page.locator('[data-kind="reconnected"]')).to_contain_text("after a long gap")
        await wait_for(lambda: len(held) == 3, timeout=30, what="the fresh snapshot's newest turns asked")
        yield tab


def pages_and_hello(frame: str) -> bool:
    return '"session_turns"' in frame or '"hello"' in frame


async def test_earlier_turns_asked_before_a_long_gap_rebuilt_the_list_are_not_shown_in_it(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The link lost for a long gap; Show earlier turns clicked as the new socket opened, before its
    `ready`: the fresh snapshot rebuilds the list and asks for its newest turns. The earlier page's
    answer, coming first, went into the new list, and the newest turns then above it: the conversation
    out of order."""
    frames = HeldFrames(monkeypatch, pages_and_hello, on=False)
    async with earlier_turns_asked_as_the_link_reopens(server, frames) as tab:
        await frames.release(1, 2)  # the earlier page's answer first, then the newest turns'
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.messages("user")).to_have_count(30)
        said = await tab.messages("user").all_inner_texts()
        assert said == [f"Question number {n}" for n in range(7, 37)], said
        tab.assert_clean()


async def test_earlier_turns_asked_before_a_long_gap_that_fail_say_nothing_in_the_rebuilt_list(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """As above, but the earlier page fails: its page was not put into the rebuilt list, yet its failure
    was, "The conversation so far could not be loaded", under a conversation loaded in full."""
    def earlier(message: str) -> bool:
        frame = json.loads(message)
        return frame.get("type") == "session_turns" and "before" in frame

    refused(monkeypatch, earlier, "internal", "the record could not be read")
    frames = HeldFrames(monkeypatch, pages_and_hello, on=False)
    async with earlier_turns_asked_as_the_link_reopens(server, frames) as tab:
        await frames.release(1, 2)  # the earlier page's failure first, then the newest turns
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.messages("user")).to_have_count(30)
        await expect(tab.by("notice").filter(has_text="could not be loaded")).to_have_count(0)
        tab.assert_clean()


async def a_message_lost_on_the_way_before_a_long_gap_is_not_dropped_from_view(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The person's message went out on a link that had died: the server never got it. The link comes
    back after a long gap (a resync, the same server): the message is neither waiting there nor in the
    record. It stays in view, said it may not have reached the agent, with Send again, not silently
    dropped from the conversation (a reload settles it so already)."""
    link = Lossy()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        link.deaf = True
        await tab.send("Lost on the way")
        mine = tab.messages("user").filter(has_text="Lost on the way")
        await expect(mine).to_have_attribute("data-state", "queued")
        server.hub._evicted_through = server.hub.seq + 1  # what the page missed is no longer kept
        link.deaf = False
        await link.cut()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await expect(tab.page.locator('[data-kind="reconnected"]')).to_contain_text("after a long gap")
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(mine).to_have_count(1)
        await expect(mine.get_by_test_id("send-again")).to_have_count(1)
        assert "Lost on the way" in (await pending(tab) or "")  # and kept for a reload
        await mine.get_by_test_id("send-again").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Lost on the way")
        await expect(tab.messages("user").filter(has_text="Lost on the way")).to_have_count(1)
        tab.assert_clean("WebSocket connection")


async def test_send_again_in_a_duplicated_tab_gives_the_agent_the_message_once(
        settings: Settings, bridge: MockBridge) -> None:
    """A duplicated browser tab copies the tab's sessionStorage: both tabs hold the same unsent message
    as their own, and both offer Send again. A's click queues it behind a running turn, of which B hears
    nothing: the page cannot tell; the server can, by the message's client id (Send again reuses it).
    The agent gets the message once, and B marks it taken."""
    async with restartable(settings) as server, chromium() as browser:
        a = await signed_in(browser, server.port)
        await one_waiting(a, bridge, server)
        mine = '[data-testid="message"][data-role="user"][data-client-id]'  # the tab's own, not another's
        in_a = a.page.locator(mine).filter(has_text="Second, still waiting")
        await server.stop()  # drops it from the queue: not taken
        await server.start()
        await a.page.evaluate("window.dispatchEvent(new Event('online'))")
        await a.connected()
        await expect(in_a.get_by_test_id("send-again")).to_have_count(1)

        copied = await a.page.evaluate("JSON.stringify(Object.assign({}, sessionStorage))")
        b = await open_tab(browser, a.base)
        await b.page.context.add_init_script(  # a duplicate: A's sessionStorage, before the page's scripts
            "if (!sessionStorage.getItem('duplicated')) { sessionStorage.setItem('duplicated', '1'); "
            f"for (const [k, v] of Object.entries({copied})) sessionStorage.setItem(k, v); }}")
        await b.page.goto(a.base)
        await b.connected()
        in_b = b.page.locator(mine).filter(has_text="Second, still waiting")
        await expect(in_b.get_by_test_id("send-again")).to_have_count(1)  # B offers it too

        bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))  # the next turn hangs
        asked = len(bridge.agent_requests())
        await a.send("Third, the slow one")
        await bridge.wait_for(lambda bridge: len(bridge.agent_requests()) > asked)
        await in_a.get_by_test_id("send-again").click()  # A's goes: taken, queued behind the slow one
        await expect(in_a).to_have_attribute("data-state", "queued")
        await expect(in_b.get_by_test_id("send-again")).to_have_count(1)  # B has heard nothing of it
        await in_b.get_by_test_id("send-again").click()
        await expect(in_b).to_have_attribute("data-state", "taken")
        await expect(in_b).to_contain_text("the agent took it already")
        await a.by("interrupt").click()  # the slow one ends: A's runs
        await expect(a.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(b.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(b.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)  # shown once
        await expect(in_b).to_have_attribute("data-state", "started")  # the taken message is its turn's
        app = server.app
        assert app is not None  # the page shows the answer before the turn's end: wait for it, then nothing is left
        await wait_for(lambda: app.runtime.queued == 0 and app.runtime.turn_id is None, timeout=30,
                       what="nothing queued, nothing running")
        sent = [r for r in bridge.agent_requests() if "Second, still waiting" in r.last_user_text]
        assert len(sent) == 1, [r.last_user_text for r in bridge.agent_requests()]
        kept = await pending(b)
        assert kept is None or "Second, still waiting" not in kept  # settled: not offered after a reload
        a.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")
        b.assert_clean()


class DeadLink:
    """Sits on the page's sockets. While `lose_out`, what the page sends is lost (a dead link's send
    buffer); while `lose_in`, what the server sends is; while `hold_in`, what the server sends waits
    until `release`. `cut` ends the page's socket, and the page reconnects and resumes."""

    def __init__(self) -> None:
        self.lose_out = self.lose_in = self.hold_in = False
        self.held: list[str | bytes] = []
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()
        page_side.on_message(lambda message: None if self.lose_out else server_side.send(message))

        def to_page(message: str | bytes) -> None:
            if self.hold_in:
                self.held.append(message)
            elif not self.lose_in:
                page_side.send(message)
        server_side.on_message(to_page)
        self.sockets.append(page_side)

    async def cut(self, tab: Tab) -> None:
        self.lose_out = self.lose_in = False
        await self.sockets[-1].close()
        await expect(tab.by("connection-status")).not_to_have_attribute("data-state", "connected")

    def release(self) -> None:
        self.hold_in = False
        for message in self.held:
            self.sockets[-1].send(message)
        self.held.clear()


async def a_message_lost_in_a_dead_link_is_said_not_sent_after_the_resume(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The page sends into a link that is dead (the frame is lost), then resumes with the same server:
    the message is not left waiting for the agent for ever, even once a later one is answered. The
    server never had it, so it is said not sent, with a Send again, which the agent then answers once."""
    link = DeadLink()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        link.lose_out = True
        await tab.send("Lost in the tunnel")
        await link.cut(tab)
        await tab.connected()
        await expect(tab.page.locator('[data-kind="reconnected"]').last).to_contain_text("resumed")
        lost = tab.messages("user").filter(has_text="Lost in the tunnel")
        await expect(lost).to_have_attribute("data-state", "refused")
        await expect(lost).to_contain_text("not sent: the connection was lost before the Sprite got it")
        await tab.send("After the tunnel")
        await expect(tab.messages("assistant").last).to_contain_text("You said: After the tunnel")
        assert not any("Lost in the tunnel" in r.last_user_text for r in bridge.agent_requests())
        await lost.get_by_test_id("send-again").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Lost in the tunnel")
        await expect(tab.messages("user").filter(has_text="Lost in the tunnel")).to_have_count(1)
        await expect(tab.by("send-again")).to_have_count(0)
        assert sum("Lost in the tunnel" in r.last_user_text for r in bridge.agent_requests()) == 1
        assert await pending(tab) is None
        tab.assert_clean()


async def a_message_the_server_took_unheard_is_never_called_not_sent_on_the_resume(
        server: SpriteOS, bridge: MockBridge, where: str) -> None:
    """The page's message reached the server, but nothing the server said since reached the page (its
    turn_started is among the events the resume replays, or the message waits behind a running
    turn: `ready.waiting`). It is the person's own, never said not sent: a Send again would have the
    agent do it twice."""
    link, text = DeadLink(), f"Taken unheard, {where}"  # its own words: the parts share a session
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        if where == "waiting":
            bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))
            asked = len(bridge.agent_requests())  # the server's earlier parts' (tests/console_browser.py's `on_one_server`)
            await tab.send("First, the slow one")
            await bridge.wait_for(lambda b: len(b.agent_requests()) > asked)
        link.lose_in = True
        await tab.send(text)
        await watch_for_send_again(tab)
        if where == "started":
            await wait_for(lambda: any(text in r.last_user_text for r in bridge.agent_requests()),
                           timeout=30, what="the agent taking it")
        else:
            await wait_for(lambda: len(server.runtime.waiting) == 1, timeout=30, what="the message, waiting")
        await link.cut(tab)
        await tab.connected()
        mine = tab.messages("user").filter(has_text=text)
        if where == "waiting":
            await expect(mine).to_have_attribute("data-state", "queued")
            await tab.by("interrupt").click()
        await expect(tab.messages("assistant").last).to_contain_text(f"You said: {text}")
        await expect(mine).to_have_attribute("data-state", "started")
        await expect(mine).to_have_count(1)
        assert not await tab.page.evaluate("window.sendAgainSeen")  # not even for a moment
        assert sum(text in r.last_user_text for r in bridge.agent_requests()) == 1
        tab.assert_clean()


async def watch_for_send_again(tab: Tab) -> None:
    """From now on, `window.sendAgainSeen` says whether a Send again was ever shown, if only for a moment."""
    await tab.page.evaluate("""() => {
        window.sendAgainSeen = false;
        new MutationObserver(() => {
            window.sendAgainSeen ||= document.querySelector('[data-testid="send-again"]') !== null;
        }).observe(document.body, { subtree: true, childList: true });
    }""")


async def a_message_sent_before_the_resumes_ready_is_not_called_not_sent(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The page reconnects and sends before the new socket's `ready` comes: the server reads it after
    the snapshot, so `ready.waiting` cannot hold it. It waits for its turn as any message does; only
    the one lost in the dead link is said not sent."""
    link = DeadLink()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        link.lose_out = True
        await tab.send("Lost in another tunnel")
        link.hold_in = True  # the next socket's ready, and all after it, wait
        await link.cut(tab)
        await wait_for(lambda: len(link.held) >= 1, timeout=30, what="the new socket's ready, held")
        await tab.by("composer").fill("Sent before the ready")  # Enter: the Send button waits for the ready
        await tab.by("composer").press("Enter")
        await wait_for(lambda: any("Sent before the ready" in r.last_user_text for r in bridge.agent_requests()),
                       timeout=30, what="the agent taking it")
        link.release()
        await tab.connected()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Sent before the ready")
        before = tab.messages("user").filter(has_text="Sent before the ready")
        await expect(before).to_have_attribute("data-state", "started")
        lost = tab.messages("user").filter(has_text="Lost in another tunnel")
        await expect(lost).to_have_attribute("data-state", "refused")
        await expect(tab.by("send-again")).to_have_count(1)
        tab.assert_clean()


async def test_a_message_over_the_limit_is_said_too_long_and_never_sent(server: SpriteOS, bridge: MockBridge) -> None:
    """Text over the message limit is said plainly to be too long (its length, the limit) before it is
    sent, and stays in the box; a too-long message the server refuses (a page that sent it anyway) is
    said too long, with no Send again that could not succeed."""
    too_long = "x" * (MAX_USER_TEXT + 1)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.send(too_long)
        await expect(tab.page.locator('[data-kind="error"]').last).to_contain_text(
            "This message is too long to send: 100,001 characters, and the limit is 100,000. It is still in the box")
        assert await tab.by("composer").input_value() == too_long
        await expect(tab.messages("user")).to_have_count(0)
        assert not bridge.agent_requests()

        # A page that sends it anyway (here the route lengthens a short one on its way): the server says
        # it plainly, naming the message, and the page offers no Send again that could not succeed.
        other = await signed_in(browser, server.port, route=lengthened)
        await other.send("Make me long")
        mine = other.messages("user").filter(has_text="Make me long")
        await expect(mine).to_have_attribute("data-state", "refused")
        await expect(mine).to_contain_text(
            "not accepted: the message is too long to send: 100,001 characters, and the limit is 100,000")
        await expect(other.by("send-again")).to_have_count(0)
        other.assert_clean()
        assert not bridge.agent_requests()
        tab.assert_clean()


def lengthened(page_side: WebSocketRoute) -> None:
    """The page's socket, but a message "Make me long" reaches the server one character over the limit."""
    server_side = page_side.connect_to_server()

    def to_server(message: str | bytes) -> None:
        if isinstance(message, str) and '"Make me long"' in message:
            frame = json.loads(message)
            frame["text"] = "x" * (MAX_USER_TEXT + 1)
            message = json.dumps(frame)
        server_side.send(message)
    page_side.on_message(to_server)


# The tests above that need a server and its CLI but no restart, on one server (tests/console_browser.py's `on_one_server`).
ON_ONE_SERVER = [
    a_message_waiting_behind_a_turn_is_kept_through_a_reload,  # first: no one else's first turn
    a_message_sent_while_the_link_was_dead_is_shown_once_after_a_reload,
    a_message_lost_in_a_dead_link_is_said_not_sent_after_the_resume,
    functools.partial(a_message_the_server_took_unheard_is_never_called_not_sent_on_the_resume, where="started"),
    functools.partial(a_message_the_server_took_unheard_is_never_called_not_sent_on_the_resume, where="waiting"),
    a_message_sent_before_the_resumes_ready_is_not_called_not_sent,
    a_message_waiting_through_a_long_gap_stays_in_view_as_the_persons_own,  # it evicts: no resume after
    a_message_lost_on_the_way_before_a_long_gap_is_not_dropped_from_view,  # so does it
    signing_out_leaves_no_unanswered_message_in_the_tab,  # last: a turn left running
]


one_server, test_on_one_server = one_server_tests(ON_ONE_SERVER, "console-work-kept-one-server")  # each part above, a test of its own
