"""The person's messages not yet answered, as the chat keeps them (kept_messages.js): shown at once
after a reload, before the socket is back; looked for again after a reload when the page could not
tell whether the agent took them; gone for good at Sign out, a sign-in in the same page bringing none
back; and a command the Sprite ran, which leaves no turn in the record, settled as taken by asking the Sprite.
Real Chromium, real server and CLI, the mock Bridge."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, WebSocketRoute, expect

from devkit.harness import TOKEN, Restartable, restartable
from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from sprite_os import gateway
from sprite_os.config import Settings
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.system import MemorySystem
from sprite_os.server import SpriteOS
from tests.conftest import wait_for
from tests.console_browser import (
    Tab,
    chromium,
    intercepted,
    one_server_tests,
    open_tab,
    signed_in,
)
from tests.test_console_work_kept_e2e import (
    Muted,
    one_waiting,
    pending,
    restart_unheard,
    send_unheard,
)

pytestmark = pytest.mark.e2e


class Unreachable:
    """Passes the page's sockets through, but while `away` a new one gets nothing from the server (no
    `ready`: the Sprite cannot be reached); `back` closes those, and the page's next socket goes through."""

    def __init__(self) -> None:
        self.away = False
        self.waiting: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        if self.away:
            self.waiting.append(page_side)
        else:
            page_side.connect_to_server()

    async def back(self) -> None:
        self.away = False
        for page_side in self.waiting:
            await page_side.close(code=4000, reason="the link lost")
        self.waiting.clear()


class Held:
    """Passes the page's sockets through, but while `on` the server's frames holding `words` never reach
    the page (a request's answer that never comes); `drop` ends the open ones as a lost link does."""

    def __init__(self, words: str, *, on: bool = False) -> None:
        self.words, self.on = words, on
        self.sockets: list[WebSocketRoute] = []

    def route(self, page_side: WebSocketRoute) -> None:
        self.sockets.append(page_side)
        server_side = page_side.connect_to_server()
        server_side.on_message(lambda m: None if self.on and self.words in str(m) else page_side.send(m))

    async def drop(self) -> None:
        for page_side in self.sockets:
            await page_side.close(code=4000, reason="the link lost")
        self.sockets.clear()


async def clocked_tab(browser: Browser, port: int, held: Held) -> Tab:
    """A tab signed in and connected through `held`, its clock installed: its timers run on at will."""
    tab = await open_tab(browser, f"http://127.0.0.1:{port}/")
    await tab.page.clock.install()
    await tab.page.route_web_socket(lambda _url: True, held.route)
    await tab.sign_in()
    await tab.connected()
    return tab


async def a_reload_shows_the_kept_messages_before_the_socket_is_back(server: SpriteOS, bridge: MockBridge) -> None:
    """The tab reloads while the Sprite cannot be reached: its kept message is on the page at once, said
    to wait for the connection, not an empty chat; once connected it is settled as before (still waiting
    behind the running turn, then its own when it starts)."""
    link = Unreachable()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        waiting = await one_waiting(tab, bridge)
        link.away = True
        await tab.page.reload()
        await expect(tab.by("connection-status")).not_to_have_attribute("data-state", "connected")
        await expect(waiting).to_have_count(1)  # before any `ready`
        await expect(waiting).to_contain_text("waiting for the connection")
        await expect(waiting.get_by_test_id("send-again")).to_have_count(0)
        assert "Second, still waiting" in (await pending(tab) or "")  # still kept
        await link.back()
        await tab.connected()
        await expect(waiting).to_have_attribute("data-state", "queued")
        await expect(waiting).to_contain_text("waiting for the agent")
        await expect(waiting).to_have_count(1)
        await tab.by("interrupt").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Second, still waiting")
        await expect(waiting).to_have_attribute("data-state", "started")
        await expect(tab.messages("user").filter(has_text="Second, still waiting")).to_have_count(1)
        tab.assert_clean("WebSocket connection")


class RecordAway(Muted):
    """`Muted`, and while `record_away` the conversation's record cannot be read: the server's answer to
    session_turns comes as memory_unavailable."""

    record_away = False

    def route(self, page_side: WebSocketRoute) -> None:
        server_side = page_side.connect_to_server()

        def to_page(message: str | bytes) -> None:
            if self.on:
                return
            if self.record_away and isinstance(message, str) and '"session_turns_result"' in message:
                frame = json.loads(message)
                message = json.dumps({"type": "error", "code": "memory_unavailable", "request_id": frame["request_id"],
                                      "message": "memory is not available right now"})
            page_side.send(message)
        server_side.on_message(to_page)


async def a_message_that_may_not_have_reached_the_agent_is_checked_again_after_a_reload(
        server: SpriteOS, bridge: MockBridge) -> None:
    """Sent while the page heard nothing back, and taken; the reloaded page could not read the record,
    so it said the message may not have reached the agent. The next reload reads it: the message is
    settled by its turn, as a waiting one is, not left with a Send again that the record answers."""
    link = RecordAway()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        await send_unheard(tab, link, server, bridge, "Taken while unheard")
        link.on, link.record_away = False, True
        await tab.page.reload()
        await tab.connected()
        mine = tab.messages("user").filter(has_text="Taken while unheard")
        await expect(mine).to_contain_text("this may not have reached the agent")
        assert "Taken while unheard" in (await pending(tab) or "")

        link.record_away = False
        await tab.page.reload()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await expect(tab.messages("assistant").last).to_contain_text("You said: Taken while unheard")
        await expect(mine).to_have_count(1)
        await expect(mine).to_have_attribute("data-state", "started")  # its turn, from the record
        await expect(tab.by("send-again")).to_have_count(0)
        await tab.page.wait_for_function("sessionStorage.getItem('sprite-os.pending') === null")  # settled
        tab.assert_clean()


async def signing_in_again_without_a_reload_brings_back_no_kept_message(server: SpriteOS, bridge: MockBridge) -> None:
    """Sign out empties the tab's kept messages; signing in again in the same page (no reload) must not
    write them back from what the page still held, nor show them as the tab's own, nor keep the draft."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await one_waiting(tab, bridge, text="Waiting at sign out")  # its own words: a shared session
        await tab.by("composer").fill("A draft of mine")
        await tab.by("sign-out").click()
        assert await pending(tab) is None
        # Nor does the page still say the record's history is loaded: the wait for the next sign-in's
        # would be over before it began, and what follows checked a page not yet settled.
        await expect(tab.page.locator("[data-history]")).to_have_count(0)
        await tab.by("token-input").fill(TOKEN)  # in the same page: no reload
        await tab.by("token-submit").click()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        mine = '[data-testid="message"][data-role="user"][data-client-id]'  # the tab's own
        await expect(tab.page.locator(mine)).to_have_count(0)
        await expect(tab.by("composer")).to_have_value("")
        await tab.by("interrupt").click()  # the waiting message runs: another device's now, for this page
        await expect(tab.messages("assistant").last).to_contain_text("You said: Waiting at sign out")
        assert await pending(tab) is None
        assert await tab.page.evaluate("sessionStorage.getItem('sprite-os.draft')") is None
        tab.assert_clean()


async def test_a_history_request_in_flight_at_sign_out_says_nothing_to_the_next_person(server: SpriteOS) -> None:
    """The conversation's record was still being asked for when the person signed out: its request was
    left pending, and its timeout, 30 s on, put "could not be loaded" into the next person's view."""
    held = Held("session_turns_result", on=True)  # the first socket's answer to session_turns never comes
    async with chromium() as browser:
        tab = await clocked_tab(browser, server.port, held)  # the request's timeout, run on at will
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(0)  # asked, not answered
        await tab.by("sign-out").click()
        held.on = False
        await tab.by("token-input").fill(TOKEN)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await tab.page.clock.run_for(31_000)  # past the first request's timeout
        await expect(tab.by("notice").filter(has_text="could not be loaded")).to_have_count(0)
        tab.assert_clean()


# Every element under the app whose own words say "signed out": what a request Sign out ended left behind.
_SAYS_SIGNED_OUT = """() => [...document.querySelectorAll("#app *")]
    .filter((e) => [...e.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && /signed out/i.test(n.textContent)))
    .map((e) => `${e.dataset.testid || e.className || e.tagName}: ${e.textContent}`)"""


async def a_request_of_any_view_in_flight_at_sign_out_says_nothing_to_the_next_person(
        server: SpriteOS, bridge: MockBridge) -> None:
    """Sign out ends every request on its way (none of them settles): a turn's forget and a card's close in the chat,
    the past sessions' list, an upload with a second file queued behind it, the memory's reload. None of
    them leaves a word in the page for the next person who signs in on it, nor goes on for them (the
    queued file is not uploaded once they are connected); and the next sign-in starts on the chat, as a
    fresh page does (on Memory or Files, the view asked before the new socket was open, said "Not
    connected" and loaded nothing)."""
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"id": "plan", "title": "The garden plan"}),
                             Text("The plan is on the canvas.")))
    held = Held('"request_id"')  # once on, no answer to a request reaches the page
    picked_from = server.settings.layout.root.parent  # the scenario's folder, beside its workspace
    first, second = picked_from / "first upload.txt", picked_from / "second upload.txt"
    first.write_text("the first file\n")
    second.write_text("the second file\n")
    documents = server.settings.layout.root / "documents"
    async with chromium() as browser:
        tab = await clocked_tab(browser, server.port, held)  # the upload's retries, run on at will
        await tab.send("Put the garden plan on a card")
        await expect(tab.by("turn-status")).to_have_count(1)
        await expect(tab.page.locator('[data-card-id="plan"]')).to_have_count(1)
        await tab.memory("files")
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        await tab.by("chat-tab").click()
        held.on = True
        await tab.by("forget-turn").click()
        await tab.by("forget-confirm").click()
        await tab.page.locator('[data-card-id="plan"]').get_by_test_id("card-close").click()
        await tab.by("past-sessions").click()
        await expect(tab.by("session-list")).to_have_count(1)
        await tab.by("memory-tab").click()
        await tab.by("memory-refresh").click()
        await expect(tab.by("memory-panel-files")).to_have_attribute("data-loading", "true")
        await tab.by("files-tab").click()
        await tab.by("upload-input").set_input_files([str(first), str(second)])
        await expect(tab.by("upload")).to_have_count(1)  # the first, its start not answered
        await tab.by("sign-out").click()  # on the Files view
        held.on = False
        assert await tab.page.evaluate(_SAYS_SIGNED_OUT) == []

        await tab.by("token-input").fill(TOKEN)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        await expect(tab.page.locator("body")).to_have_attribute("data-view", "chat")
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        await tab.page.clock.run_for(60_000)  # past every retry an upload makes (about 40 s)
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        await expect(tab.by("upload")).to_have_count(0)
        await expect(tab.by("files-flash")).to_have_text("")
        await tab.memory("files")
        await expect(tab.by("memory-flash")).to_have_text("")
        assert await tab.page.evaluate(_SAYS_SIGNED_OUT) == []
        assert not (documents / first.name).exists() and not (documents / second.name).exists()
        tab.assert_clean()


# A view of the page's own with no Sign out check of its own: it shows what its request answered, or its
# error, as a new view that forgot the rule would. Its connection is the page's module's, a second one.
_CHECKLESS_VIEW = """async (token) => {
  const { Connection } = await import("/console/js/connection.js");
  const shown = document.createElement("p");
  shown.dataset.testid = "checkless-view";
  document.getElementById("app").append(shown);
  const conn = new Connection({ onFrame() {}, onAuthFailed() {}, onStatus: ({ state }) => { shown.dataset.state = state; } });
  const ask = () => { // not waited for: the page's own code awaits it, as a view's would
    conn.request("memory_boot_prompt").then(() => { shown.textContent = "answered"; }, (error) => { shown.textContent = error.message; });
  };
  window.checkless = { start: () => conn.start(token), stop: () => conn.stop(), ask };
  conn.start(token);
}"""


async def test_a_request_ended_by_sign_out_settles_into_no_view_even_one_without_a_check(server: SpriteOS) -> None:
    """A request on its way at Sign out, in a view whose code has no check of its own: the rule that
    nothing of it reaches the next person is the connection's, not each view's. Its error path never runs
    (no "signed out", nor, past its timeout, "did not answer in time"), while the next sign-in's request
    that gets no answer still says so."""
    held = Held("memory_boot_prompt_result", on=True)  # no answer to the view's request reaches the page
    async with chromium() as browser:
        tab = await clocked_tab(browser, server.port, held)  # the request's timeout, run on at will
        view = tab.by("checkless-view")
        await tab.page.evaluate(_CHECKLESS_VIEW, TOKEN)
        await expect(view).to_have_attribute("data-state", "connected")
        await tab.page.evaluate("window.checkless.ask()")  # its answer held back
        await tab.page.evaluate("window.checkless.stop()")  # Sign out
        await tab.page.evaluate("window.checkless.start()")  # the next person, in the same page
        await expect(view).to_have_attribute("data-state", "connected")
        await tab.page.clock.run_for(31_000)  # past the first request's timeout
        await expect(view).to_have_text("")

        await tab.page.evaluate("window.checkless.ask()")  # the next person's own, unanswered
        await tab.page.clock.run_for(31_000)
        await expect(view).to_have_text("The Sprite did not answer in time.")
        tab.assert_clean()


@pytest.mark.parametrize("ended", ["sign out", "a refused token"])
@pytest.mark.parametrize(("refused", "line"), [("upload_start", "upload"), ("download_chunk", "download-progress")])
async def test_a_transfer_waiting_to_retry_when_its_sign_in_ends_is_never_sent_again(
        server: SpriteOS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str, line: str, ended: str) -> None:
    """The Sprite drops every start of an upload, or every chunk of a download, for rate, and the page
    waits to ask again (a pause that doubles) when the person signs out. Sign out ended the requests in
    flight, not that pause: its retry went over the next person's connection, and the file of the person
    who left was uploaded under the next one's sign-in. It asks nothing more, and leaves no line. A token
    refused (a new one provisioned) ends the sign-in too: the transfer went on over the next sign-in's
    socket (a chunk), or said "Not connected" to it (a start). It ends as at Sign out, and its line
    says it stopped (most likely the same person signs in again: they learn to pick the file again)."""
    sockets: list[gateway._Connection] = []  # the page's, in order: the first is the person's who signs out
    asked: list[int] = []  # each `refused` request the server was sent: on which of them

    async def drop_for_rate(conn: gateway._Connection, message: str) -> bool:
        if conn not in sockets:
            sockets.append(conn)
        if f'"{refused}"' not in message:
            return False
        asked.append(sockets.index(conn))
        if conn is not sockets[0]:
            return False
        await conn._rate_limited(0.0, message)
        return True

    intercepted(monkeypatch, drop_for_rate)
    picked = tmp_path / "left behind.txt"
    picked.write_text("the first person's file\n")
    (server.settings.layout.root / "to download.txt").write_text("a file of the workspace\n")
    documents = server.settings.layout.root / "documents"
    async with chromium() as browser:
        link = Held("nothing held")
        tab = await clocked_tab(browser, server.port, link)  # the retry's pause, run on at will
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        # The clock stopped: the pause between tries lasts until the test runs it on (a try sent as the
        # link drops would be lost with it, and said so, as after any lost link).
        await tab.page.clock.pause_at(await tab.page.evaluate("Date.now() + 1_000"))
        if line == "upload":
            await tab.by("upload-input").set_input_files(str(picked))
        else:
            await tab.page.locator('[data-name="to download.txt"]').get_by_test_id("download").click()
        await expect(tab.by(line)).to_have_attribute("data-state", "retrying")  # refused, waiting to ask again
        token = TOKEN
        if ended == "sign out":
            await tab.by("sign-out").click()
        else:
            token = "a-new-token-for-this-sprite"
            monkeypatch.setattr(server, "_token", token.encode())  # provisioned anew meanwhile
            await link.drop()  # the page reconnects at once (the pause still held), and its token is refused
            await tab.page.clock.run_for(1)
            await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
            # The Files view is out of sight: the sign-in form says what stopped, and what to do.
            await expect(tab.by("login-error")).to_contain_text(
                f"A transfer stopped ({picked.name if line == 'upload' else 'to download.txt'}): start it again from Files once signed in.")
        await tab.by("token-input").fill(token)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        for _ in range(60):  # past every retry a transfer makes (about 40 s), a second at a time: a
            await tab.page.clock.run_for(1_000)  # request sent meanwhile has its answer, not its timeout
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        if ended == "sign out":
            await expect(tab.by(line)).to_have_count(0)
            await expect(tab.by("files-flash")).to_have_text("")
        else:
            await expect(tab.by(line)).to_have_attribute("data-state", "error")
            await expect(tab.by(line).get_by_test_id("transfer-state")).to_have_text(
                f"stopped: the token was refused; {'upload' if line == 'upload' else 'download'} it again")
            await expect(tab.by("files-flash")).to_contain_text("A transfer stopped (")  # said in the view too
        assert asked and set(asked) == {0}, asked  # never on the next person's socket
        assert not (documents / picked.name).exists()
        tab.assert_clean(*(() if ended == "sign out" else ("HTTP Authentication failed", "401")))  # the refused socket's


async def the_check_of_a_sign_in_that_ended_does_nothing_to_the_next_one(
        server: SpriteOS, _bridge: MockBridge, answer: int) -> None:
    """A token the Sprite refused at the socket: the page asks /console/auth why, and the answer is slow
    (a Sprite waking behind its proxy). The person signs out meanwhile, and the next one signs in. The
    late answer was taken as the next sign-in's: a 401 ended it (their token dropped, "refused" said to
    them, their open socket left running behind the sign-in form), a 503 set a second socket going beside
    the open one (every event twice). It belongs to the sign-in that asked it, and does nothing."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        checks: list[Any] = []
        await tab.page.route("**/console/auth", lambda route: checks.append(route))  # held: answered when the test says
        await tab.sign_in("a-token-this-sprite-refuses")
        await wait_for(lambda: bool(checks))  # the first sign-in's check, on its way
        await tab.by("sign-out").click()
        await tab.by("token-input").fill(TOKEN)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        sockets = len(await tab.socket_times())
        async with tab.page.expect_response("**/console/auth"):
            await checks[0].fulfill(status=answer)
        await tab.page.wait_for_timeout(1_500)  # past a retry's first pause (0.5 s, and its jitter)
        await expect(tab.by("connection-status")).to_have_attribute("data-state", "connected")
        await expect(tab.by("login-error")).to_have_text("")
        assert await tab.page.evaluate("sessionStorage.getItem('sprite-os.token')") == TOKEN
        assert len(await tab.socket_times()) == sockets
        await tab.send("Still signed in?")
        await expect(tab.messages("assistant").last).to_contain_text("You said: Still signed in?")
        tab.assert_clean("HTTP Authentication failed", str(answer))  # the refused socket's, the check's


async def a_token_refused_while_a_card_is_open_large_leaves_the_sign_in_form_usable(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The person reads a card opened large (a modal dialog over the page) when the token is refused (a
    new one provisioned): the sign-in form came back under the dialog, which stayed open over it, the
    form inert behind it and its token box never given the focus, the card still there for whoever
    signs in next. The form comes back as after Sign out, with no view of a card over it."""
    with pytest.MonkeyPatch.context() as monkeypatch:  # the token put back for the parts after it
        bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"id": "plan", "title": "The garden plan"}),
                                 Text("The plan is on the canvas.")))
        link = Held("nothing held")
        async with chromium() as browser:
            tab = await signed_in(browser, server.port, route=link.route)
            await tab.send("Put the garden plan on a card")
            card = tab.page.locator('[data-testid="card"][data-card-id="plan"]')
            await card.get_by_test_id("card-expand").click()
            await expect(tab.by("card-dialog")).to_be_visible()
            token = "a-new-token-for-this-sprite"
            monkeypatch.setattr(server, "_token", token.encode())  # provisioned anew meanwhile
            await link.drop()  # the page reconnects, and its token is refused
            await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
            await expect(tab.by("card-dialog")).to_be_hidden()
            await expect(tab.by("token-input")).to_be_focused()
            await tab.page.keyboard.type(token)  # where the focus is: the form is not behind a dialog
            await tab.page.keyboard.press("Enter")
            await tab.connected()
            await expect(card).to_have_count(1)
            await expect(tab.by("card-dialog")).to_be_hidden()
            tab.assert_clean("HTTP Authentication failed", "401")  # the refused socket's


@pytest.mark.parametrize("then", ["a refused token", "save again"])
async def test_a_save_whose_answer_was_lost_is_not_called_another_s_change(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch, then: str) -> None:
    """The person saves their edit of a memory file; the Sprite writes it, but the answer is lost with
    the link. The token refused as the page reconnects (a new one provisioned), signed in again, the
    Memory view said the file "changed since you began editing", their draft kept but its Save to be
    refused; reconnected by itself, their Save again was refused as changed "from another tab or device,
    or by you in another window". The change was their own Save: the edit is over, and said saved."""
    held = Held("memory_edit_result")  # once on, the Save's answer never reaches the page
    draft = "- Prefers tea to coffee in the afternoon\n"
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=held.route)
        await tab.memory("files")
        await tab.by("file-edit").click()
        await tab.by("file-editor").fill(draft)
        held.on = True
        await tab.by("file-save").click()
        await expect(tab.by("file-save")).to_have_attribute("aria-busy", "true")
        await wait_for(lambda: MemoryFiles(server.settings.layout).read("user.md") == draft)  # written
        if then == "save again":
            await held.drop()  # the answer lost with the link; the page reconnects
            held.on = False
            await tab.connected()
            await expect(tab.by("memory-flash")).to_contain_text("connection was lost")
            await tab.by("file-save").click()  # the Sprite answers it saved: the file holds this very text
            await expect(tab.by("memory-flash")).to_have_text("Saved user.md as version 1 (your edit).")
            await expect(tab.by("file-editor")).to_have_count(0)
            await expect(tab.by("file-text")).to_have_text(draft.strip())
            tab.assert_clean()
            return
        token = "a-new-token-for-this-sprite"
        monkeypatch.setattr(server, "_token", token.encode())  # provisioned anew meanwhile
        await held.drop()  # the answer lost with the link; the page reconnects, and its token is refused
        await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
        held.on = False
        await tab.by("token-input").fill(token)
        await tab.by("token-submit").click()
        await tab.connected()
        await tab.by("memory-tab").click()  # back on its files, where the person left it
        await expect(tab.by("memory-panel-files")).not_to_have_attribute("data-loading", "true")
        await expect(tab.by("memory-flash")).not_to_contain_text("changed since")
        await expect(tab.by("memory-flash")).to_contain_text("already holds your draft")
        await expect(tab.by("file-editor")).to_have_count(0)
        await expect(tab.by("file-text")).to_have_text(draft.strip())
        tab.assert_clean("HTTP Authentication failed", "401")  # the refused socket's


async def test_a_restart_takes_back_the_word_that_the_history_is_loaded(settings: Settings) -> None:
    """The server restarts: the page rebuilds its view from the new run's record. The list still said
    its history was loaded (the run's before), so a wait for the new one's was over before it began, and
    what a test checked after it ran on a page not yet settled. It says so once the new one's is."""
    held = Held("session_turns_result")  # once on, the record's history never reaches the page
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=held.route)
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        held.on = True
        await server.stop()
        await server.start()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await tab.connected()
        await expect(tab.page.locator('[data-kind="reconnected"]').last).to_contain_text("server restarted")
        await expect(tab.page.locator("[data-history]")).to_have_count(0)  # the new run's, asked, not answered
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def test_files_picked_while_the_link_is_down_wait_for_it_and_a_later_refused_token_names_none(
        server: SpriteOS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file picked while the link was down (or queued behind an upload a lost link failed) said "Not
    connected" at once: a start never sent is asked again once the link is back. And the files a
    batch queued stayed named for a refused token long after they had uploaded ("3 transfers stopped
    (b.txt, c.txt, c.txt)"): a token refused after the batch names none."""
    picked = [tmp_path / f"picked offline {n}.txt" for n in range(2)]
    for n, path in enumerate(picked):
        path.write_text(f"file {n}\n")
    documents = server.settings.layout.root / "documents"
    async with chromium() as browser:
        link = Held("nothing held")
        tab = await clocked_tab(browser, server.port, link)
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        await tab.page.clock.pause_at(await tab.page.evaluate("Date.now() + 1_000"))  # no reconnect until run on
        await link.drop()
        await expect(tab.by("connection-status")).not_to_have_attribute("data-state", "connected")
        await tab.by("upload-input").set_input_files([str(p) for p in picked])
        await expect(tab.by("upload").first).to_have_attribute("data-state", "retrying")  # not "Not connected"
        for _ in range(15):  # the reconnect, and the start asked again
            await tab.page.clock.run_for(1_000)
        await expect(tab.by("upload")).to_have_count(2)
        for line in await tab.by("upload").all():
            await expect(line).to_have_attribute("data-state", "done")
        assert sorted(p.name for p in documents.iterdir()) == sorted(p.name for p in picked)
        monkeypatch.setattr(server, "_token", b"a-new-token-for-this-sprite")  # provisioned anew, later
        await link.drop()
        await tab.page.clock.run_for(2_000)
        await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
        await expect(tab.by("login-error")).to_have_text(
            "The Sprite refused this token. Check it (it is in .os/token on the Sprite) and sign in again.")
        tab.assert_clean("HTTP Authentication failed", "401")


async def test_sign_out_leaves_nothing_of_the_person_in_the_files_view(server: SpriteOS, tmp_path: Path) -> None:
    """The person uploads a file and opens documents/, then signs out: the Files view kept their transfer
    line, "Uploaded … to documents/…", their folder's listing and its path, shown to the next person who
    signed in on the page. Sign out clears them, and the next sign-in's Files view opens on the workspace."""
    picked = tmp_path / "private notes.txt"
    picked.write_text("the first person's notes\n")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.by("files-tab").click()
        await expect(tab.by("file-list")).to_have_count(1)
        await tab.by("upload-input").set_input_files(str(picked))
        await expect(tab.by("upload")).to_have_attribute("data-state", "done")
        await expect(tab.by("files-flash")).to_contain_text("Uploaded private notes.txt")
        await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
        await expect(tab.page.locator("#view-files")).to_have_attribute("data-path", "documents")
        await expect(tab.page.locator('[data-name="private notes.txt"]')).to_have_count(1)

        await tab.by("sign-out").click()
        await expect(tab.by("upload")).to_have_count(0)  # from the page, not only hidden with the view
        await expect(tab.by("files-flash")).to_have_text("")
        await expect(tab.by("file-list")).to_have_count(0)
        await expect(tab.page.locator("#view-files nav.crumbs")).to_have_text("")
        await expect(tab.page.locator("#view-files")).not_to_have_attribute("data-path", "documents")

        await tab.by("token-input").fill(TOKEN)  # the next person, in the same page
        await tab.by("token-submit").click()
        await tab.connected()
        await tab.by("files-tab").click()
        await expect(tab.page.locator("#view-files")).to_have_attribute("data-path", "")
        await expect(tab.page.locator('[data-name="documents"]')).to_have_count(1)  # the workspace, not documents/
        await expect(tab.by("upload")).to_have_count(0)
        await expect(tab.by("files-flash")).to_have_text("")
        tab.assert_clean()


async def compacted_unheard(server: Restartable, browser: Browser, bridge: MockBridge, muted: Muted) -> Tab:
    """A turn, then /compact sent with the page's link dead: the CLI runs it, and the page hears nothing."""
    tab = await signed_in(browser, server.port, route=muted.route)
    await tab.send("The garden plan is due in May")
    await expect(tab.by("turn-status")).to_have_count(1)
    muted.on = True
    await tab.send("/compact")
    await bridge.wait_for(lambda b: any(r.is_compaction for r in b.agent_requests()))
    app = server.app
    assert app is not None
    await wait_for(lambda: app.runtime.state == "idle" and app.runtime.queued == 0, timeout=30, what="the command's end")
    return tab


async def test_a_command_the_sprite_ran_unheard_is_settled_as_taken_after_a_restart(
        settings: Settings, bridge: MockBridge) -> None:
    """The person typed /compact; the CLI ran it (a command leaves no turn in the record) while the page
    heard nothing back, and the server restarted. No turn names it, but the Sprite recorded its client id:
    the page asks (sends it again with that id), the Sprite refuses it already_taken, and the page says the
    agent took it, without a Send again; the CLI compacted once."""
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser:
        tab = await compacted_unheard(server, browser, bridge, muted)
        await restart_unheard(server, muted, tab)
        mine = tab.messages("user").filter(has_text="/compact")
        await expect(mine).to_have_attribute("data-state", "taken")
        await expect(mine).to_contain_text("the agent took it already")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)
        assert await pending(tab) is None
        assert sum(r.is_compaction for r in bridge.agent_requests()) == 1
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def test_a_command_is_not_asked_of_a_server_that_does_not_know_the_commands_taken(
        settings: Settings, bridge: MockBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    """/compact ran unheard, then the server restarted without the ids an earlier run took (its record
    unread at start; so is a version rolled back to from before it kept them, or memory off). The page
    asked anyway, its history being readable, and the Sprite, not knowing the id, compacted a second time.
    Its `ready` says it does not know them: the page says it cannot tell, with no Send again, and asks nothing."""
    muted = Muted()
    async with restartable(settings) as server, chromium() as browser:
        tab = await compacted_unheard(server, browser, bridge, muted)

        async def unread(*_args: object) -> None:
            raise OSError("the record could not be read at start")

        monkeypatch.setattr(MemorySystem, "taken_messages", unread)
        await restart_unheard(server, muted, tab)
        await expect(tab.page.locator('[data-checks="settled"]')).to_have_count(1)
        mine = tab.messages("user").filter(has_text="/compact")
        await expect(mine).to_have_attribute("data-state", "command")
        await expect(mine).to_contain_text("cannot say whether it ran")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)
        await asyncio.sleep(1)  # an ask would have reached the CLI by now
        assert sum(r.is_compaction for r in bridge.agent_requests()) == 1
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def test_a_command_a_restart_dropped_from_the_queue_is_asked_and_runs_once(
        settings: Settings, bridge: MockBridge) -> None:
    """/compact waited behind a slow turn when the server restarted: dropped with the queue, never taken.
    The page asks the new server (sends it again with its own client id), which never took it, so it runs
    it now, once, as this message: started, no Send again, nothing said unsent."""
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port)
        mine = await one_waiting(tab, bridge, server, text="/compact")  # behind a turn that hangs
        await server.stop()
        await server.start()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await tab.connected()
        await expect(tab.page.locator('[data-checks="settled"]')).to_have_count(1)
        await expect(mine).to_have_count(1)
        await expect(mine).to_have_attribute("data-state", "started")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)
        await expect(mine).not_to_contain_text("not sent")
        assert server.app is not None
        await wait_for(lambda: server.app is not None and server.app.runtime.state == "idle", timeout=30,
                       what="the command's end")
        assert await pending(tab) is None
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


class HeldBack:
    """Passes the page's sockets through, but while `on` what the server sends is held (the `ready` slow
    to come back), and `release` hands it to the page; what the page sends goes out at once."""

    def __init__(self) -> None:
        self.on = False
        self.held: list[tuple[WebSocketRoute, str | bytes]] = []
        self.latest: WebSocketRoute | None = None

    def route(self, page_side: WebSocketRoute) -> None:
        self.latest = page_side
        server_side = page_side.connect_to_server()
        server_side.on_message(lambda message: self.held.append((page_side, message)) if self.on else page_side.send(message))

    def release(self) -> None:
        """The held frames of the page's latest socket reach it (an older socket's are gone with it)."""
        self.on = False
        for page_side, message in self.held:
            if page_side is self.latest:
                page_side.send(message)
        self.held.clear()


async def a_message_sent_before_the_first_ready_stays_the_persons_own(server: SpriteOS, bridge: MockBridge) -> None:
    """After a reload the socket is open but the Sprite's `ready` is slow: Enter sends the message the
    person typed (the server reads it after its snapshot). The snapshot then rebuilds the view: the
    message stays the person's own, waiting and then started, not gone from the page and back as one
    one "from another" tab or device, and never kept-and-lost for a reload in between."""
    link = HeldBack()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        link.on = True
        await tab.page.reload()
        await wait_for(lambda: link.held, timeout=15, what="the server's ready, held back")
        await expect(tab.by("connection-status")).not_to_have_attribute("data-state", "connected")
        await expect(tab.by("send-button")).to_be_enabled()  # as Enter: one rule (the socket is open)
        await tab.by("composer").fill("Typed before the ready came")
        await tab.by("composer").press("Enter")
        mine = tab.messages("user").filter(has_text="Typed before the ready came")
        await expect(mine).to_have_attribute("data-state", "queued")
        await bridge.wait_for(lambda b: any("Typed before the ready came" in r.last_user_text for r in b.agent_requests()))
        link.release()
        await tab.connected()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Typed before the ready came")
        await expect(mine).to_have_count(1)
        await expect(mine).to_have_attribute("data-state", "started")
        await expect(mine).not_to_contain_text("from another")
        assert await pending(tab) is None
        tab.assert_clean("WebSocket connection")


async def test_a_message_sent_before_a_restarted_servers_ready_is_not_called_unsent(
        settings: Settings, bridge: MockBridge) -> None:
    """The server restarted; the page's new socket is open, its `ready` slow, and Enter sends the
    person's message to the new server, which runs it. It was never waiting on the old server, so the
    restart check must not take it up: not said "not sent" beside its own answer, no Send again."""
    link = HeldBack()
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        await tab.send("Before the restart")
        await expect(tab.by("turn-status")).to_have_count(1)
        link.on = True
        await server.stop()
        await server.start()
        await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
        await wait_for(lambda: any(page_side is link.latest for page_side, _ in link.held), timeout=30,
                       what="the new server's ready, held back")
        await tab.by("composer").fill("Typed while the ready was on its way")
        await tab.by("composer").press("Enter")
        mine = tab.messages("user").filter(has_text="Typed while the ready was on its way")
        await expect(mine).to_have_attribute("data-state", "queued")
        link.release()
        await tab.connected()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Typed while the ready was on its way")
        await expect(tab.page.locator('[data-history="loaded"]')).to_have_count(1)
        # the restart check, had it taken the message up, has answered: the page says when its checks are
        await expect(tab.page.locator('[data-checks="settled"]')).to_have_count(1)
        await expect(mine).to_have_count(1)
        await expect(mine).to_have_attribute("data-state", "started")
        await expect(mine).not_to_contain_text("not sent")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)
        assert await pending(tab) is None
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")


async def a_message_sent_before_the_first_ready_is_kept_as_the_servers_own(server: SpriteOS, bridge: MockBridge) -> None:
    """Sent before the reloaded page's `ready`, the message waits behind a running turn; the tab is
    reloaded again. The server still holds it: it waits again, not said cut by a restart that never
    happened, nor offered a Send again."""
    link = HeldBack()
    async with chromium() as browser:
        tab = await signed_in(browser, server.port, route=link.route)
        bridge.faults.add(Fault("latency", seconds=60, target="agent", times=1))
        asked = len(bridge.agent_requests())  # the server's earlier parts'
        await tab.send("First, the slow one")
        await bridge.wait_for(lambda b: len(b.agent_requests()) > asked)  # out to the model, and held there
        link.on = True
        await tab.page.reload()
        await wait_for(lambda: link.held, timeout=15, what="the server's ready, held back")
        await tab.by("composer").fill("Typed while the ready was slow")
        await tab.by("composer").press("Enter")
        link.release()
        await tab.connected()
        mine = tab.messages("user").filter(has_text="Typed while the ready was slow")
        await expect(mine).to_have_attribute("data-state", "queued")
        await tab.page.reload()
        await tab.connected()
        await expect(mine).to_have_attribute("data-state", "queued")
        await expect(mine).to_contain_text("waiting for the agent")
        await expect(mine).not_to_contain_text("restarted")
        await expect(mine.get_by_test_id("send-again")).to_have_count(0)
        tab.assert_clean("WebSocket connection")


# The tab's storage refused (a browser's site settings deny it: SecurityError) for the kept messages.
_STORAGE_DENIED = """() => {
  for (const name of ["setItem", "removeItem"]) {
    const native = Storage.prototype[name];
    Storage.prototype[name] = function (key, ...rest) {
      if (key === "sprite-os.pending") throw new DOMException("The operation is insecure.", "SecurityError");
      return native.apply(this, [key, ...rest]);
    };
  }
}"""


async def a_tab_whose_storage_is_denied_chats_on_keeping_nothing(server: SpriteOS, bridge: MockBridge) -> None:
    """Keeping a message for a reload failed, and its fallback (removing the list kept before) threw the
    same SecurityError, uncaught: the message the person sent broke the chat. Nothing is kept, the chat
    goes on, and Sign out too."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.page.evaluate(_STORAGE_DENIED)
        await tab.send("Hello, with no storage")
        await expect(tab.messages("assistant").last).to_contain_text("You said: Hello, with no storage")
        tab.assert_clean()
        await tab.by("sign-out").click()
        await expect(tab.by("token-input")).to_be_visible()
        tab.assert_clean()


# The tests above that need a server and its CLI but no restart, on one server (tests/console_browser.py's `on_one_server`).
ON_ONE_SERVER = [
    a_request_of_any_view_in_flight_at_sign_out_says_nothing_to_the_next_person,  # first: its turn the only one shown
    a_message_that_may_not_have_reached_the_agent_is_checked_again_after_a_reload,
    a_tab_whose_storage_is_denied_chats_on_keeping_nothing,
    functools.partial(the_check_of_a_sign_in_that_ended_does_nothing_to_the_next_one, answer=401),
    functools.partial(the_check_of_a_sign_in_that_ended_does_nothing_to_the_next_one, answer=503),
    a_reload_shows_the_kept_messages_before_the_socket_is_back,
    signing_in_again_without_a_reload_brings_back_no_kept_message,
    a_message_sent_before_the_first_ready_stays_the_persons_own,
    a_token_refused_while_a_card_is_open_large_leaves_the_sign_in_form_usable,
    a_message_sent_before_the_first_ready_is_kept_as_the_servers_own,  # last: a turn left running
]


one_server, test_on_one_server = one_server_tests(ON_ONE_SERVER, "console-kept-messages-one-server")  # each part above, a test of its own
