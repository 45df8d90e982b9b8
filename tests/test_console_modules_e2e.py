"""The console in a real Chromium page, with no CLI and no turn: its JavaScript modules on their own,
each view or the connection driven by frames the test writes (a fake connection, or a fake WebSocket),
and the page against a server that runs no turn (its layout on a phone, a big folder). What a person
would see after a given order of events, proven without the cost of making the Sprite produce it (rule 5
of tests/README.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import expect

from devkit.harness import TOKEN
from sprite_os.console import user_files
from sprite_os.server import SpriteOS
from tests.conftest import wait_for
from tests.console_browser import PHONE, Tab, chromium, open_tab, same_browser_tab, signed_in

pytestmark = pytest.mark.e2e


async def in_page(server: SpriteOS, script: str) -> Any:
    """`script` (an async arrow function) run in a page of the console (its modules importable), signed out."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        result = await tab.page.evaluate(script)
        tab.assert_clean()
        return result


# In a page's script: `until(check)` settles once `check()` holds (polled on the page's clock), and
# fails after `ms`. What a script waits on, never a time.
UNTIL = """
const until = async (check, ms = 20_000) => {
  for (const end = performance.now() + ms; !check(); ) {
    if (performance.now() > end) throw new Error(`never: ${check}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};
"""


# A ChatView of the test's own, on a fake connection that sends everything and answers the record's page
# with no turns; `ready()` gives it a fresh snapshot; `rows()` reads the conversation as a person does;
# `heard(frame)` hands it a frame as the page's Connection does, which tells it of events skipped by seq.
CHAT = UNTIL + """
const { ChatView } = await import("/console/js/chat.js");
const { Connection } = await import("/console/js/connection.js");
const box = document.createElement("div");
document.body.append(box);
const made = (tag) => box.appendChild(document.createElement(tag));
const sent = [];
const conn = {
  links: 1, connected: true,
  send: (frame) => { sent.push(frame); return true; },
  request: async () => ({ session: { id: "s1" }, turns: [], more: false }),
};
const list = made("ol");
const form = made("form");
const composer = form.appendChild(document.createElement("textarea"));
const chat = new ChatView({ list, form, composer, send: made("button"), interrupt: made("button"),
  newSession: made("button"), agentState: made("span"), jump: made("button"), sessionCost: made("span") }, conn);
const wire = new Connection({ onFrame: (frame, seen) => chat.handle(frame, seen), onStatus: () => {}, onAuthFailed: () => {} });
const heard = (frame) => wire.receive(JSON.stringify(frame));
const ready = () => heard({ type: "ready", stream: "run-1", session_id: "s1", agent: "idle", waiting: [], cards: [] });
const say = (text) => { composer.value = text; chat.submit(); return sent.at(-1).client_id; };
const rows = () => [...list.children].map((li) => {
  const { role, testid, turnId, state } = li.dataset;
  if (role === "tool") return `tool: ${li.querySelector("strong").textContent.trim()}`;
  if (role) return `${role}: ${li.querySelector(".text").textContent}${state === "queued" ? " (waiting)" : ""}`;
  return `${testid}: ${turnId}`;
});
"""


async def test_a_message_sent_while_a_turn_runs_stays_below_that_turns_answer(server: SpriteOS) -> None:
    """The person sends a second message while the agent is still on the first: it waits at the bottom,
    and the running turn's tool call, answer and status go above it, so the conversation reads in the
    order the agent took them, as the record shows it after a reload (they went below it: the second
    question above the first's answer, its own answer under the first's status)."""
    order = await in_page(server, f"""async () => {{
        {CHAT}
        ready();
        const first = say("What is on my list?");
        chat.handle({{ type: "turn_started", turn_id: "t1", client_id: first, text: "What is on my list?" }});
        chat.handle({{ type: "text_delta", turn_id: "t1", text: "Let me look" }});
        const second = say("And add milk");
        chat.handle({{ type: "tool_use", turn_id: "t1", tool_use_id: "u1", name: "Read", summary: "list.md" }});
        chat.handle({{ type: "tool_result", turn_id: "t1", tool_use_id: "u1", is_error: false, summary: "eggs" }});
        chat.handle({{ type: "assistant_message", turn_id: "t1", text: "Eggs." }});
        chat.handle({{ type: "turn_complete", turn_id: "t1", status: "completed", duration_ms: 900 }});
        const waiting = rows();
        chat.handle({{ type: "turn_started", turn_id: "t2", client_id: second, text: "And add milk" }});
        chat.handle({{ type: "assistant_message", turn_id: "t2", text: "Added." }});
        chat.handle({{ type: "turn_complete", turn_id: "t2", status: "completed", duration_ms: 500 }});
        return {{ waiting, done: rows() }};
    }}""")
    assert order["waiting"] == [
        "user: What is on my list?", "assistant: Eggs.", "tool: Read", "turn-status: t1", "user: And add milk (waiting)",
    ]
    assert order["done"] == [
        "user: What is on my list?", "assistant: Eggs.", "tool: Read", "turn-status: t1",
        "user: And add milk", "assistant: Added.", "turn-status: t2",
    ]


async def test_the_persons_own_message_brings_the_chat_to_the_bottom_and_it_follows_the_reply(server: SpriteOS) -> None:
    """The person scrolled up to read, then sends (Enter, Send, a Send again): the view goes to the bottom,
    where their message is, and follows the reply from there, as every chat does (it stayed where they
    were, their message out of sight, only Jump to the latest shown). The agent's own words while they
    read above still leave the view where it is, with the jump offered."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        list.style.cssText = "height: 200px; overflow-y: auto";
        const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
        // Scrolled up by the person: the list's scroll event, dispatched at once (a headless page's may wait).
        const up = async () => {{ list.scrollTop = 0; list.dispatchEvent(new Event("scroll")); await frame(); }};
        const where = () => ({{ bottom: list.scrollHeight - list.scrollTop - list.clientHeight < 2, jump: !chat.jump.hidden }});
        const words = "A long answer, line after line. ".repeat(40);
        ready();
        await frame(); // the record's page shown (the view at its latest)
        for (const n of [1, 2]) {{
          const id = say(`Question ${{n}}`);
          chat.handle({{ type: "turn_started", turn_id: `t${{n}}`, client_id: id, text: `Question ${{n}}` }});
          chat.handle({{ type: "assistant_message", turn_id: `t${{n}}`, text: words }});
          chat.handle({{ type: "turn_complete", turn_id: `t${{n}}`, status: "completed", duration_ms: 900 }});
        }}
        await up();
        chat.handle({{ type: "turn_started", turn_id: "t3", client_id: "chat-other-1", text: "From the command line" }});
        chat.handle({{ type: "text_delta", turn_id: "t3", text: words }});
        await frame();
        const reading = {{ ...where(), top: list.scrollTop }};
        composer.value = "And one more";
        composer.dispatchEvent(new KeyboardEvent("keydown", {{ key: "Enter", bubbles: true }}));
        await frame();
        const entered = where();
        chat.handle({{ type: "text_delta", turn_id: "t3", text: words }});
        await frame();
        const following = where();
        await up();
        const refused = sent.at(-1).client_id;
        chat.handle({{ type: "error", code: "queue_full", message: "too many", client_id: refused }});
        await up();
        list.querySelector('[data-testid="send-again"]').click();
        await frame();
        const again = where();
        return {{ reading, entered, following, again }};
    }}""")
    assert seen["reading"] == {"bottom": False, "jump": True, "top": 0}, seen  # the agent's words: left where they read
    assert seen["entered"] == {"bottom": True, "jump": False}, seen
    assert seen["following"] == {"bottom": True, "jump": False}, seen
    assert seen["again"] == {"bottom": True, "jump": False}, seen


async def test_a_message_from_elsewhere_says_where_it_came_from_as_far_as_the_page_can_tell(server: SpriteOS) -> None:
    """A second tab of the same browser labelled the first tab's messages "from another device", which is
    false on one computer. The tabs of a browser share an id in every client id they make, so a tab says
    "from another tab of this browser" of theirs, and of others what it can know; where the browser's
    storage is denied it cannot tell, and says so. The words are the message's own text, what a screen
    reader reads of it too."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        ready();
        const other = new ChatView({{ list: made("ol"), form: made("form"), composer: made("textarea"), send: made("button"),
          interrupt: made("button"), newSession: made("button"), agentState: made("span"), jump: made("button"),
          sessionCost: made("span") }}, conn);
        other.composer.value = "From my other tab";
        other.submit();
        sessionStorage.removeItem("sprite-os.sent"); // what it sent is in the other tab's storage, not this one's
        const label = (n, clientId) => {{
          chat.handle({{ type: "turn_started", turn_id: `t${{n}}`, client_id: clientId, text: `Message ${{n}}` }});
          chat.handle({{ type: "turn_complete", turn_id: `t${{n}}`, status: "completed", duration_ms: 1 }});
          const item = list.querySelector(`[data-turn-id="t${{n}}"][data-role="user"]`);
          return {{ text: item.textContent, named: item.hasAttribute("aria-label") || Boolean(item.querySelector("[aria-hidden], [aria-label]")) }};
        }};
        const labels = [
          label(1, sent.at(-1).client_id),
          label(2, "web.elsewhere0.m1abc-x1y2z3-1"),
          label(3, "chat-0123456789abcdef-1"),
          label(4, "web-m1abc-x1y2z3-1"),
        ];
        // A browser whose storage is denied to the page: it cannot tell its own tabs from other devices.
        for (const name of ["getItem", "setItem"]) {{
          const native = Storage.prototype[name];
          Storage.prototype[name] = function (key, ...rest) {{
            if (this === localStorage) throw new DOMException("The operation is insecure.", "SecurityError");
            return native.apply(this, [key, ...rest]);
          }};
        }}
        const denied = new ChatView({{ list: made("ol"), form: made("form"), composer: made("textarea"), send: made("button"),
          interrupt: made("button"), newSession: made("button"), agentState: made("span"), jump: made("button"),
          sessionCost: made("span") }}, conn);
        denied.handle({{ type: "turn_started", turn_id: "t5", client_id: sent.at(-1).client_id, text: "Message 5" }});
        denied.composer.value = "Sent with no storage";
        denied.submit();
        labels.push({{ text: denied.list.querySelector('[data-turn-id="t5"]').textContent, named: false }});
        return {{ labels, deniedId: sent.at(-1).client_id }};
    }}""")
    assert seen["labels"] == [
        {"text": "Message 1from another tab of this browser", "named": False},
        {"text": "Message 2from another browser or device", "named": False},
        {"text": "Message 3from another app or device", "named": False},
        {"text": "Message 4from another tab or device", "named": False},
        {"text": "Message 5from another tab or device", "named": False},
    ], seen
    assert seen["deniedId"].startswith("web-"), seen  # no browser's id in it: no tab takes it for its browser's


async def test_a_draft_the_full_storage_cannot_keep_leaves_no_older_one_for_a_reload(server: SpriteOS) -> None:
    """The tab's storage fills mid-session (other keys, a long conversation kept for a reload): the draft's
    write fails, and the storage went on holding the draft as it was before, so a reload brought back words
    the person had since taken out (a password pasted and deleted) as their draft. A draft that cannot be
    kept is no longer kept at all: the reload finds none, as where storage is denied."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        composer.value = "my password is hunter2";
        composer.dispatchEvent(new Event("input"));
        const kept = sessionStorage.getItem("sprite-os.draft");
        const write = Storage.prototype.setItem;
        Storage.prototype.setItem = function (key, value) {{
          if (key === "sprite-os.draft") throw new DOMException("The quota has been exceeded.", "QuotaExceededError");
          return write.call(this, key, value);
        }};
        composer.value = "my password is";
        composer.dispatchEvent(new Event("input"));
        Storage.prototype.setItem = write;
        return {{ kept, after: sessionStorage.getItem("sprite-os.draft") }};
    }}""")
    assert seen == {"kept": "my password is hunter2", "after": None}, seen


async def test_the_recorded_conversation_says_where_each_message_came_from_as_the_live_one_does(server: SpriteOS) -> None:
    """A tab showed another tab's message "from another tab of this browser" while it was open, and bare once
    the tab reloaded and read the conversation back from the record, as if the person had typed it here. The
    record keeps each message's client id: the conversation read back marks them as the live one does, all
    but the tab's own (and a turn recorded before client ids were kept, which cannot tell)."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        await chat.browserReady; // the browser's id, made at the view's start
        const mine = say("Mine");
        const turn = (n, clientId) => ({{ turn_id: `t${{n}}`, turn: n, user_message: `Message ${{n}}`, client_id: clientId,
          tool_calls: [], status: "completed", agent_response: "Done.", cost_usd: 0.0001, at: 1795216801 }});
        conn.request = async () => ({{ session: {{ id: "s1" }}, more: false, turns: [turn(1, mine),
          turn(2, `web.${{localStorage.getItem("sprite-os.browser")}}.m1abc-x1y2z3-1`), turn(3, "web.elsewhere0.m1-x-1"),
          turn(4, "chat-0123456789abcdef-1"), turn(5, null)] }});
        ready();
        await until(() => list.dataset.checks === "settled"); // the record's page drawn
        return [...list.querySelectorAll('[data-role="user"][data-turn]')].map((item) => item.textContent);
    }}""")
    assert seen == [
        "Message 1",
        "Message 2from another tab of this browser",
        "Message 3from another browser or device",
        "Message 4from another app or device",
        "Message 5",
    ], seen


async def test_an_answer_being_written_says_where_words_went_by_while_the_page_was_away(server: SpriteOS) -> None:
    """The streamed words are the only events a resume does not replay, and a page loaded mid-answer gets
    none written before it: reloaded in the middle of an answer, the page showed it beginning mid-sentence,
    and after a dropped link it ran on with words left out ("w21 w26"), with no sign of either until the
    turn ended. The missing words are marked "…" where they are, and the whole answer replaces them."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        const snapshot = (seq) => heard({{ type: "ready", stream: "run-1", session_id: "s1", agent: "running",
          turn_id: "t1", turn_text: "Tell me", turn_client_id: "chat-x", waiting: [], cards: [], seq, replayed: 0 }});
        const written = () => list.querySelector('[data-turn-id="t1"][data-role="assistant"] .text').textContent;
        const word = (text, seq) => heard({{ type: "text_delta", turn_id: "t1", text, seq }});
        snapshot(10); // loaded while the answer is being written
        word("word22 ", 11);
        word("word23 ", 12);
        const loaded = written();
        snapshot(12); // a resume: the link was down while 13 and 14 went by
        word("word26 ", 15);
        word("word27", 16);
        const resumed = written();
        heard({{ type: "assistant_message", turn_id: "t1", text: "word1 word2", seq: 17 }});
        return {{ loaded, resumed, whole: written() }};
    }}""")
    assert seen == {"loaded": "… word22 word23 ", "resumed": "… word22 word23  … word26 word27", "whole": "word1 word2"}, seen


async def test_words_missed_while_away_are_marked_whatever_went_by_with_them(server: SpriteOS) -> None:
    """Words of the answer written while the page was away, with another event among them (another tab
    uploaded a file, closed a card, forgot an old turn): that event is replayed, the words are not, and
    the page marked no gap, the next word right after the replayed event's seq; the answer ran on with
    words left out ("word12 word16"), unmarked. A seq skipped at any event since the answer's last words
    marks them; one skipped before a turn began, or before a whole message came, does not, nor do those a
    forgotten turn's events left in a replay (only its start and its end are replayed)."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        ready();
        const written = (turn) => list.querySelector(`[data-turn-id="${{turn}}"][data-role="assistant"] .text`).textContent;
        const word = (turn, text, seq) => heard({{ type: "text_delta", turn_id: turn, text, seq }});
        heard({{ type: "turn_started", turn_id: "t1", client_id: "chat-x-1", text: "Tell me", seq: 10 }});
        word("t1", "word11 ", 11);
        word("t1", "word12 ", 12);
        // The link drops: 13 to 15 are words, not replayed; 16, an upload from another tab, is.
        heard({{ type: "ready", stream: "run-1", session_id: "s1", agent: "running", turn_id: "t1",
          turn_text: "Tell me", turn_client_id: "chat-x-1", waiting: [], cards: [], seq: 12, replayed: 1 }});
        heard({{ type: "file_uploaded", path: "documents/a.txt", size: 3, seq: 16 }});
        word("t1", "word17", 17);
        const away = written("t1");
        // Words skipped before a whole message came (it replaces them), or before a new turn began: none missing.
        heard({{ type: "assistant_message", turn_id: "t1", text: "All of it.", seq: 20 }});
        heard({{ type: "turn_complete", turn_id: "t1", status: "completed", duration_ms: 1, seq: 21 }});
        heard({{ type: "turn_started", turn_id: "t2", client_id: "chat-x-2", text: "More", seq: 25 }});
        word("t2", "first", 26);
        heard({{ type: "turn_complete", turn_id: "t2", status: "completed", duration_ms: 1, seq: 27 }});
        // The link drops again while another tab runs a turn and forgets it: its start and end are replayed
        // (28, 32), its words, tool calls and answer are not, then its tombstone (33). A new turn begins.
        heard({{ type: "ready", stream: "run-1", session_id: "s1", agent: "idle", waiting: [], cards: [], seq: 27, replayed: 3 }});
        heard({{ type: "turn_started", turn_id: "t3", client_id: "chat-y-1", text: "", seq: 28 }});
        heard({{ type: "turn_complete", turn_id: "t3", status: "completed", duration_ms: 1, seq: 32 }});
        heard({{ type: "turns_forgotten", session_id: "s1", turns: [], turn_ids: ["t3"], seq: 33 }});
        heard({{ type: "turn_started", turn_id: "t4", client_id: "chat-x-3", text: "Again", seq: 34 }});
        word("t4", "fresh", 35);
        return {{ away, whole: written("t1"), next: written("t2"), afterForget: written("t4") }};
    }}""")
    assert seen == {"away": "word11 word12  … word17", "whole": "All of it.", "next": "first", "afterForget": "fresh"}, seen


async def test_an_answer_begun_after_a_tool_the_page_saw_is_not_marked_as_missing_words(server: SpriteOS) -> None:
    """Loaded while the agent ran a tool (no words being written), the page saw the tool's call and result,
    then the answer written from its first word; it marked it "…" at its start all the same, as if words
    had gone by before the page loaded, until the answer was whole. A tool call of the running turn seen
    since the snapshot ends the message that may have been on its way then: what follows is all seen."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        const written = () => list.querySelector('[data-turn-id="t1"][data-role="assistant"] .text').textContent;
        heard({{ type: "ready", stream: "run-1", session_id: "s1", agent: "running", turn_id: "t1",
          turn_text: "Look it up", turn_client_id: "chat-x", waiting: [], cards: [], seq: 10, replayed: 0 }});
        heard({{ type: "tool_use", turn_id: "t1", tool_use_id: "u1", name: "Read", summary: "notes.md", seq: 11 }});
        heard({{ type: "tool_result", turn_id: "t1", tool_use_id: "u1", is_error: false, summary: "ok", seq: 12 }});
        heard({{ type: "text_delta", turn_id: "t1", text: "Here is", seq: 13 }});
        return written();
    }}""")
    assert seen == "Here is", seen


async def test_a_tab_that_joins_mid_turn_says_where_the_running_turns_message_came_from(server: SpriteOS) -> None:
    """A tab opened (or signed in) while the agent is on another tab's message showed that message bare,
    as if the person had typed it here, where a turn started while the tab was open says where its message
    came from. The running turn's message is marked by its client id (`ready.turn_client_id`) as any is; the
    tab's own, after a reload mid-turn (it left the kept messages when its turn started), is not."""
    seen = await in_page(server, f"""async () => {{
        {CHAT}
        await chat.browserReady; // the browser's id, made at the view's start
        const browser = localStorage.getItem("sprite-os.browser");
        const joined = (clientId, view = chat) => {{
          view.handle({{ type: "ready", stream: `run-${{clientId}}`, session_id: "s1", agent: "running", turn_id: "t1",
            turn_text: "Summarise my notes", turn_client_id: clientId, waiting: [], cards: [] }});
          return view.list.querySelector('[data-turn-id="t1"][data-role="user"]').textContent;
        }};
        const labels = [joined(`web.${{browser}}.m1abc-x1y2z3-1`), joined("web.elsewhere0.m1abc-x1y2z3-1"),
          joined("chat-0123456789abcdef-1"), joined(null)];
        // This tab's own message, running when the page is reloaded: the reloaded page's view knows it.
        const mine = say("Summarise my notes");
        chat.handle({{ type: "turn_started", turn_id: "t1", client_id: mine, text: "Summarise my notes" }});
        const reloaded = new ChatView({{ list: made("ol"), form: made("form"), composer: made("textarea"), send: made("button"),
          interrupt: made("button"), newSession: made("button"), agentState: made("span"), jump: made("button"),
          sessionCost: made("span") }}, conn);
        labels.push(joined(mine, reloaded));
        return labels;
    }}""")
    assert seen == [
        "Summarise my notesfrom another tab of this browser",
        "Summarise my notesfrom another browser or device",
        "Summarise my notesfrom another app or device",
        "Summarise my notesfrom another app or device",
        "Summarise my notes",
    ], seen


# Before the page's scripts: a look at the browser's id that finds none takes a second before the page
# goes on, so that two tabs opened together both look before either has made one (as two tabs opened in
# the same instant, each in its own process, can); each tab counts the ids it writes.
SLOW_FIRST_LOOK = """
const look = Storage.prototype.getItem;
Storage.prototype.getItem = function (key) {
  const found = look.call(this, key);
  if (this === localStorage && key === "sprite-os.browser" && found === null) {
    for (const end = Date.now() + 1000; Date.now() < end; );
  }
  return found;
};
window.__browserIdsMade = 0;
const write = Storage.prototype.setItem;
Storage.prototype.setItem = function (key, value) {
  if (this === localStorage && key === "sprite-os.browser") window.__browserIdsMade += 1;
  return write.call(this, key, value);
};
"""


async def test_two_tabs_opened_in_the_same_instant_share_one_browser_id(server: SpriteOS) -> None:
    """Two tabs of a browser with nothing in its storage, opened together: each found no id, each made one
    and kept its own for its life, and each then labelled the other's messages "from another browser or
    device". The id is made once for the browser (under a lock the browser's tabs share), and a tab goes by
    the one the browser keeps: the other tab's message is "from another tab of this browser"."""
    async with chromium() as browser:
        first = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await first.page.context.add_init_script(SLOW_FIRST_LOOK)
        second = await same_browser_tab(first)
        await asyncio.gather(first.page.goto(first.base), second.page.goto(second.base))
        for tab in (first, second):
            await tab.by("token-input").fill(TOKEN)
            await tab.by("token-submit").click()
            await tab.connected()
        await first.send("Hello from the first tab")
        heard = second.messages("user").filter(has_text="Hello from the first tab")
        await expect(heard).to_have_text("Hello from the first tabfrom another tab of this browser")
        ids = await second.page.evaluate("localStorage.getItem('sprite-os.browser')"), await first.page.evaluate(
            "localStorage.getItem('sprite-os.browser')")
        assert ids[0] == ids[1] and ids[0], ids
        made = [await tab.page.evaluate("window.__browserIdsMade") for tab in (first, second)]
        assert sorted(made) == [0, 1], made  # one tab made it, the other found it
        first.assert_clean()
        second.assert_clean()


# A Connection of the test's own on fake sockets (`sockets`, each `open()`ed, `answer(frame)`ed or left
# silent by the test; `connected()` the first), listening as the page does but over milliseconds: `quiet`
# with nothing heard before it asks (`ping`), `patience` more before it takes the link for dead.
SOCKETS = UNTIL + """
const { Connection } = await import("/console/js/connection.js");
const sockets = [];
window.WebSocket = class extends EventTarget {
  static OPEN = 1;
  constructor() { super(); this.readyState = 0; this.sent = []; this.closed = false; sockets.push(this); }
  send(data) { this.sent.push(JSON.parse(data)); }
  close() { this.closed = true; this.readyState = 3; }
  open() { this.readyState = 1; this.dispatchEvent(new Event("open")); }
  answer(frame) { this.dispatchEvent(new MessageEvent("message", { data: JSON.stringify(frame) })); }
};
const states = [];
const conn = new Connection({ onFrame: () => {}, onStatus: (s) => states.push(s.state), onAuthFailed: () => {},
  quiet: 200, patience: 300, awaited: 5_000 });
const pings = (ws) => ws.sent.filter((f) => f.type === "ping").length;
// Signed in, the first socket open and `ready` (its last event 7; `replayed` events to follow): that socket.
const connected = (replayed) => {
  conn.start("a-token");
  sockets[0].open();
  sockets[0].answer({ type: "ready", stream: "run-1", seq: 7, replayed });
  return sockets[0];
};
"""


async def test_a_link_dead_but_not_closed_is_noticed_and_reconnected(server: SpriteOS) -> None:
    """A laptop asleep, a network that changed under the page: the socket is dead, but the browser does not
    close it for many minutes (TCP gives up after about 15), while the page says "connected" and a message
    sent into it waits for an agent that never hears it. The page asks the Sprite (`ping`) after a quiet
    spell, and a link that then answers nothing is dropped and the page reconnects, resuming where it was;
    one that answers, or keeps talking, is kept."""
    seen = await in_page(server, f"""async () => {{
        {SOCKETS}
        const first = connected();
        // Alive: each ping answered, the link is kept, however many quiet spells pass.
        for (let n = 1; n <= 3; n += 1) {{
          await until(() => pings(first) === n);
          first.answer({{ type: "pong" }});
        }}
        const kept = sockets.length === 1 && !first.closed;
        // Dead: the next ping is never answered. A new socket, resuming from the last event seen.
        await until(() => pings(first) === 4);
        await until(() => sockets.length === 2);
        const second = sockets[1];
        second.open();
        return {{ kept, dropped: first.closed, connected: conn.ws === second, hello: second.sent[0], states }};
    }}""")
    assert seen["kept"], seen
    assert seen["dropped"] and seen["connected"], seen
    assert seen["hello"] == {"type": "hello", "protocol": 1, "client": "sprite-console", "last_seq": 7, "stream": "run-1"}
    assert "waiting" in seen["states"], seen


async def test_events_skipped_are_told_and_a_restarted_server_is_resumed_from_its_own_numbers(server: SpriteOS) -> None:
    """The connection tells the views of events that went by unseen (a seq skipped: the streamed words a
    resume does not replay), and counts afresh from a restarted server's snapshot. It kept the largest seq
    of the run before: a restarted server numbers its events from 1, so the next drop resumed with a
    `last_seq` from the new run's future, which the server cannot replay (a fresh snapshot, the conversation
    rebuilt, "Reconnected after a long gap"), and no seq skipped in the new run was told until it passed the
    old one's."""
    seen = await in_page(server, f"""async () => {{
        {SOCKETS}
        const told = [];
        conn.onFrame = (frame, {{ skipped }}) => told.push(`${{frame.seq}}${{skipped ? " skipped" : ""}}`);
        const first = connected();
        first.answer({{ type: "turn_started", turn_id: "t1", text: "Hi", seq: 40 }});
        first.dispatchEvent(new CloseEvent("close", {{ code: 1012 }})); // the server restarts
        await until(() => sockets.length === 2);
        sockets[1].open();
        sockets[1].answer({{ type: "ready", stream: "run-2", seq: 3, resync: true }});
        sockets[1].answer({{ type: "file_uploaded", path: "documents/a.txt", size: 1, seq: 4 }});
        sockets[1].answer({{ type: "file_uploaded", path: "documents/b.txt", size: 1, seq: 6 }}); // 5 went by unseen
        sockets[1].dispatchEvent(new CloseEvent("close", {{ code: 1006 }})); // the link drops
        await until(() => sockets.length === 3);
        sockets[2].open();
        return {{ told, hello: sockets[2].sent[0] }};
    }}""")
    assert seen["told"] == ["7", "40 skipped", "3", "4", "6 skipped"], seen
    assert seen["hello"] == {"type": "hello", "protocol": 1, "client": "sprite-console", "last_seq": 6, "stream": "run-2"}, seen


async def test_a_resumes_replay_still_on_its_way_on_a_slow_link_is_not_taken_for_a_dead_link(server: SpriteOS) -> None:
    """On a slow link one big frame takes longer than the quiet spell and the patience together (a browser
    hands a message over only once it is whole, and the ping's answer is queued behind it): the page
    dropped the link, resumed, and the Sprite sent the frame again, to be dropped again, for ever (300,000
    characters at 32 kbit/s, every 45 s). While events a resume's `ready` said it replays are still due, the
    page waits longer; once they are in, a link that answers nothing is dropped at the usual patience."""
    seen = await in_page(server, f"""async () => {{
        {SOCKETS}
        const ws = connected(2);
        ws.answer({{ type: "text_delta", turn_id: "t1", text: "Here", seq: 6 }}); // the other, big, still on its way
        await until(() => pings(ws) === 1);
        await new Promise((r) => setTimeout(r, 1_200)); // four times the patience
        const kept = sockets.length === 1 && !ws.closed;
        ws.answer({{ type: "assistant_message", turn_id: "t1", text: "A long answer", seq: 7 }});
        await until(() => pings(ws) === 2);
        const asked = performance.now();
        await until(() => sockets.length === 2);
        return {{ kept, dropped: ws.closed, after: performance.now() - asked }};
    }}""")
    assert seen["kept"], seen
    assert seen["dropped"] and seen["after"] < 2_500, seen  # the usual patience (300 ms), not the 5 s awaited


async def test_a_replay_announced_larger_than_it_came_does_not_slow_every_later_dead_link_check(server: SpriteOS) -> None:
    """A `ready` that said it replays more events than came after it (a server or a proxy counting them
    otherwise) left them due for the socket's life: every dead link after it, an hour later too, was
    waited on for the 3 minutes a slow replay is given, not the usual patience. A ping's answer comes
    after every frame the Sprite queued before it: once one is in, nothing announced is still due."""
    seen = await in_page(server, f"""async () => {{
        {SOCKETS}
        const ws = connected(3);
        ws.answer({{ type: "assistant_message", turn_id: "t1", text: "All that came", seq: 8 }});
        await until(() => pings(ws) === 1);
        ws.answer({{ type: "pong", seq: 8 }}); // the link holds, and everything before the answer came
        await until(() => pings(ws) === 2); // a quiet spell later, the link dies: nothing answers
        const asked = performance.now();
        await until(() => sockets.length === 2);
        return {{ dropped: ws.closed, after: performance.now() - asked }};
    }}""")
    assert seen["dropped"] and seen["after"] < 2_500, seen  # the usual patience (300 ms), not the 5 s awaited


async def test_a_clock_set_back_does_not_keep_a_dead_link_for_as_long(server: SpriteOS) -> None:
    """The machine's clock steps back (a correction on waking, a time set by hand, a VM restored) after
    the link last spoke: the page counted the quiet from a moment now in its future, and asked nothing, so
    a link that died meanwhile stayed "connected" for as long as the clock went back (an hour here)."""
    seen = await in_page(server, f"""async () => {{
        {SOCKETS}
        const first = connected();
        await until(() => pings(first) === 1);
        first.answer({{ type: "pong" }});
        const wall = Date.now;
        Date.now = () => wall.call(Date) - 3_600_000; // an hour back, and the link dies: nothing more comes
        try {{
          await until(() => sockets.length === 2, 5_000);
        }} finally {{
          Date.now = wall;
        }}
        return {{ pings: pings(first), dropped: first.closed }};
    }}""")
    assert seen == {"pings": 2, "dropped": True}

async def test_a_message_sent_into_a_quiet_link_asks_at_once_whether_it_holds(server: SpriteOS) -> None:
    """The person wakes the laptop and types: the message goes with a `ping` at once (the link had been
    quiet), so a dead link is noticed the patience after it, not a whole quiet spell later."""
    seen = await in_page(server, """async () => {
        const { Connection } = await import("/console/js/connection.js");
        const sockets = [];
        window.WebSocket = class extends EventTarget {
          static OPEN = 1;
          constructor() { super(); this.readyState = 0; this.sent = []; sockets.push(this); }
          send(data) { this.sent.push(JSON.parse(data).type); }
          close() { this.readyState = 3; }
        };
        // Quiet 10 s: its own asking (at 10 s) is not what the test sees; it looks every 5 s.
        const conn = new Connection({ onFrame: () => {}, onStatus: () => {}, onAuthFailed: () => {}, quiet: 10_000, patience: 300 });
        conn.start("a-token");
        const ws = sockets[0];
        ws.readyState = 1;
        ws.dispatchEvent(new Event("open"));
        ws.dispatchEvent(new MessageEvent("message", { data: JSON.stringify({ type: "ready", stream: "run-1" }) }));
        const fresh = conn.send({ type: "user_message", text: "hi", client_id: "c1" }); // the link just spoke
        const before = [...ws.sent];
        while (Date.now() - conn.heard < 5_200) await new Promise((r) => setTimeout(r, 50));
        conn.send({ type: "user_message", text: "good morning", client_id: "c2" });
        const after = ws.sent.slice(before.length);
        const start = performance.now();
        while (sockets.length < 2 && performance.now() - start < 20_000) await new Promise((r) => setTimeout(r, 20));
        return { fresh, before, after, reconnected: sockets.length === 2 };
    }""")
    assert seen["before"] == ["hello", "user_message"], seen  # a link that just spoke is not asked
    assert seen["after"][:2] == ["user_message", "ping"], seen
    assert seen["reconnected"], seen


async def test_a_card_closed_while_open_large_leaves_the_focus_on_the_canvas(server: SpriteOS) -> None:
    """The person reads a card opened large, by keyboard; the agent (or another device) closes it: the view
    closes, and the focus goes to the canvas's next card, not to the page's body (the dialog gave it back
    to the closed card's Open, gone with it), where a keyboard user would start again from the top."""
    seen = await in_page(server, """async () => {
        const { CanvasView } = await import("/console/js/canvas.js");
        const root = document.body.appendChild(document.createElement("div"));
        const canvas = new CanvasView(root, document.createElement("span"), {}, () => {});
        const card = (id, title, at) => ({ id, title, kind: "note", body: "Eggs, milk", updated_at: at });
        canvas.handle({ type: "ready", cards: [card("c1", "Groceries", 2), card("c2", "Plan", 1)] });
        const open = root.querySelector('[data-card-id="c1"] [data-testid="card-expand"]');
        open.focus();
        open.click();
        const inView = document.activeElement.dataset.testid;
        canvas.handle({ type: "card_closed", card_id: "c1" });
        const to = document.activeElement;
        return { inView, open: canvas.dialog.open, focus: to.dataset.testid, card: to.closest("[data-card-id]")?.dataset.cardId };
    }""")
    assert seen == {"inView": "card-dialog-close", "open": False, "focus": "card-expand", "card": "c2"}



@pytest.mark.parametrize("large", [True, False])
async def test_a_card_closed_in_the_middle_of_the_canvas_leaves_the_focus_on_the_card_after_it(
        server: SpriteOS, large: bool) -> None:
    """The person is on the second of three cards (reading it large, or on its own buttons) when it is
    closed: the focus goes to the card after it, where they were in the canvas, not back to the first card
    (a keyboard user would start again from the top); the last card closed gives it to the one before."""
    seen = await in_page(server, f"""async () => {{
        const {{ CanvasView }} = await import("/console/js/canvas.js");
        const root = document.body.appendChild(document.createElement("div"));
        const canvas = new CanvasView(root, document.createElement("span"), {{}}, () => {{}});
        const card = (id, at) => ({{ id, title: id, kind: "note", body: "", updated_at: at }});
        canvas.handle({{ type: "ready", cards: [card("c1", 3), card("c2", 2), card("c3", 1)] }});
        const on = (id) => {{
          const open = root.querySelector(`[data-card-id="${{id}}"] [data-testid="card-expand"]`);
          open.focus();
          if ({str(large).lower()}) open.click();
        }};
        const where = () => document.activeElement.closest("[data-card-id]")?.dataset.cardId;
        on("c2");
        canvas.handle({{ type: "card_closed", card_id: "c2" }});
        const middle = where();
        on("c3");
        canvas.handle({{ type: "card_closed", card_id: "c3" }});
        return {{ middle, last: where() }};
    }}""")
    assert seen == {"middle": "c3", "last": "c1"}

async def test_the_last_card_closed_leaves_the_focus_on_the_canvas_tab_when_the_chat_is_hidden(
        server: SpriteOS) -> None:
    """On the Canvas view (a phone's, or the canvas on its own) the person closes the last card by keyboard:
    the focus goes to the Canvas tab, not to the hidden message box, which took none (it fell to the page's
    body). (This page shows no chat either: it is signed out.)"""
    seen = await in_page(server, """async () => {
        const { CanvasView } = await import("/console/js/canvas.js");
        const root = document.body.appendChild(document.createElement("div"));
        const canvas = new CanvasView(root, document.createElement("span"), {}, () => {});
        canvas.handle({ type: "ready", cards: [{ id: "c1", title: "Groceries", kind: "note", body: "", updated_at: 1 }] });
        root.querySelector('[data-testid="card-close"]').focus();
        canvas.handle({ type: "card_closed", card_id: "c1" });
        return document.activeElement.id;
    }""")
    assert seen == "tab-canvas"

# What of the page sticks out past the window's right edge (a table's or a code block's own scroll aside).
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const out = [...document.querySelectorAll("header.top *, #app *")].filter((e) => !e.closest(".table-wrap, pre"))
    .filter((e) => e.getBoundingClientRect().width && e.getBoundingClientRect().right > width + 1);
  return { scroll: document.documentElement.scrollWidth - width, out: out.slice(0, 5).map((e) => e.id || e.className || e.tagName) };
}"""


@pytest.mark.parametrize("width", [PHONE["width"], 320, 280])
async def test_the_chat_fits_a_phone_with_the_session_cost_shown(server: SpriteOS, width: int) -> None:
    """On a phone (390 px), at 320 px (a desktop window at 400 % zoom) and at 280 px (a small phone), the
    chat's session bar wraps: its buttons went past the window's edge once the session had a cost, New
    session off the screen and the whole chat, the Send button too, wider than the window, scrolled
    sideways. At 280 px the header's four tabs pushed the whole page 29 px sideways; they fit (wrapping
    rather than overflowing with a card count beside Canvas), and each, reached by the keyboard, shows its
    focus ring inside the window."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/", viewport={"width": width, "height": 700})
        await tab.sign_in()
        await tab.connected()
        await tab.page.evaluate("document.getElementById('session-cost').textContent = 'This session: $0.0123'")
        assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}
        await tab.by("past-sessions").click()
        await tab.by("past-close").wait_for()
        assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}
        await tab.page.evaluate("document.getElementById('card-count').textContent = '12'")
        await tab.by("chat-tab").focus()
        for testid in ["canvas-tab", "files-tab", "memory-tab"]:
            await tab.page.keyboard.press("ArrowRight")
            await expect(tab.by(testid)).to_be_focused()
            assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}, testid
            ring = await tab.page.evaluate(FOCUS_RING)
            assert ring["visible"] and 0 <= ring["left"] and ring["right"] <= width, (testid, ring)
        tab.assert_clean()


async def test_the_files_view_fits_280_px_at_a_large_font(server: SpriteOS) -> None:
    """At 280 px (a small phone) with the browser's font set large (a 24 px root), the Files view's list
    of files pushed the page sideways. Nothing scrolls sideways, in the workspace nor in a folder."""
    documents = server.settings.layout.root / "documents"
    documents.mkdir(parents=True, exist_ok=True)
    (documents / "quarterly-report-final-version-2.pdf").write_bytes(b"x" * 123_456)
    (documents / "notes.txt").write_text("notes")
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/", viewport={"width": 280, "height": 700})
        await tab.sign_in()
        await tab.connected()
        await tab.page.evaluate("document.documentElement.style.fontSize = '24px'")
        await tab.by("files-tab").click()
        await expect(tab.by("file-entry").first).to_be_visible()
        assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}
        await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
        await expect(tab.page.locator('[data-name="notes.txt"]')).to_be_visible()
        assert await tab.page.evaluate(OVERFLOW) == {"scroll": 0, "out": []}
        tab.assert_clean()


# The focused element's outline (its ring, drawn outside it) and where it lies across the window.
FOCUS_RING = """() => {
  const e = document.activeElement;
  const style = getComputedStyle(e);
  const out = parseFloat(style.outlineWidth) + parseFloat(style.outlineOffset);
  const box = e.getBoundingClientRect();
  return { visible: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0,
           left: box.left - out, right: box.right + out };
}"""


@asynccontextmanager
async def files_to_download(server: SpriteOS, names: list[str]) -> AsyncIterator[tuple[Tab, list[str]]]:
    """A signed-in tab on the Files view of `documents/`, which holds `names`; and the names of the files
    the browser saved, as it saves them."""
    for name in names:
        (server.settings.layout.root / "documents" / name).write_text(name)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        saved: list[str] = []
        tab.page.on("download", lambda download: saved.append(download.suggested_filename))
        await tab.by("files-tab").click()
        await tab.page.locator('[data-name="documents"]').get_by_test_id("open-folder").click()
        yield tab, saved


async def test_downloads_clicked_in_a_row_are_all_saved(server: SpriteOS) -> None:
    """The person clicks Download on 16 files one after another: every line said "downloaded", but the
    browser saved 11 (Chromium drops files handed to it to save in a burst, and says nothing). The page
    hands them over one at a time, a moment apart: all 16 are saved."""
    names = [f"note-{n:02}.txt" for n in range(16)]
    async with files_to_download(server, names) as (tab, saved):
        for name in names:
            await tab.page.locator(f'[data-name="{name}"]').get_by_test_id("download").click()
        await expect(tab.by("download-progress").filter(has_text="downloaded")).to_have_count(16, timeout=60_000)
        await wait_for(lambda: len(saved) == 16, timeout=10, what="every file saved")
        assert sorted(saved) == names
        tab.assert_clean()


async def test_a_download_the_browser_would_not_take_does_not_stop_the_ones_after_it(server: SpriteOS) -> None:
    """Downloads are handed to the browser one after another: one whose hand-off failed (the browser
    out of memory for its file's address, say) left the queue failed, and every download after it, for
    the page's life, came in whole and was never saved, its line saying the first one's failure. The
    failed one says why; those after it are saved."""
    names = ["first.txt", "second.txt"]
    async with files_to_download(server, names) as (tab, saved):
        await tab.page.evaluate("""() => {
          const make = URL.createObjectURL;
          let refused = 1;
          URL.createObjectURL = (blob) => { if (refused-- > 0) throw new Error("out of memory"); return make(blob); };
        }""")
        for name in names:
            await tab.page.locator(f'[data-name="{name}"]').get_by_test_id("download").click()
            await expect(tab.by("download-progress").filter(has_text=name)).not_to_have_attribute("data-state", "running")
        first, second = (tab.by("download-progress").filter(has_text=name) for name in names)
        await expect(first.get_by_test_id("transfer-state")).to_have_text("out of memory")
        await expect(second.get_by_test_id("transfer-state")).to_have_text("downloaded")
        await wait_for(lambda: saved == ["second.txt"], timeout=10, what="the second file saved")
        tab.assert_clean()


# A FilesView of the test's own on a fake connection whose every download is one byte, ready at once;
# `handed` the names of the files it hands the browser, `lines()` what each download's line says.
SAVES = UNTIL + """
const { FilesView } = await import("/console/js/files.js");
const conn = { signIn: new AbortController(), request: async (type, { path }) => (type === "download_start"
  ? { download_id: path, name: path, size: 1, chunk_bytes: 65536 } : { data: btoa("a"), eof: true }) };
const files = new FilesView(document.body.appendChild(document.createElement("div")), conn);
const click = HTMLAnchorElement.prototype.click;
const handed = [];
let onHanded = () => {};
HTMLAnchorElement.prototype.click = function () { // not saved: counted
  if (!this.download) return click.call(this);
  handed.push(this.download);
  onHanded(this.download);
};
const lines = () => Object.fromEntries([...document.querySelectorAll('[data-testid="download-progress"]')]
  .map((li) => [li.firstChild.textContent, li.querySelector('[data-testid="transfer-state"]').textContent]));
"""


async def test_a_download_handed_to_the_browser_is_not_said_stopped_by_the_sign_ins_end_after_it(server: SpriteOS) -> None:
    """The page waits a moment after each file it hands the browser before it hands the next; a download
    was only said done once that moment was over. A token refused in it (the Sprite's token changed) said
    the file, saved already, "stopped: the token was refused; download it again", and the sign-in form
    asked for it again: a second copy. Handed over, it is downloaded; the wait holds up the next one only."""
    seen = await in_page(server, f"""async () => {{
        {SAVES}
        onHanded = () => setTimeout(() => conn.signIn.abort("refused"), 0); // saved; the token refused a moment later
        await files.download("a.txt", "a.txt");
        await until(() => conn.signIn.signal.aborted); // the sign-in ended after the hand-off
        return {{ handed, lines: lines(), stopped: files.stoppedNote() }};
    }}""")
    assert seen == {"handed": ["a.txt"], "lines": {"a.txt": "downloaded"}, "stopped": ""}, seen


async def test_downloads_waiting_their_turn_when_the_sign_in_ends_are_not_saved(server: SpriteOS) -> None:
    """Downloads done and waiting to be handed to the browser, one at a time, when the person signs out:
    those not yet handed over are not (the next person's browser window would save the last one's files),
    their lines say so, and the next sign-in's downloads do not wait on them."""
    seen = await in_page(server, f"""async () => {{
        {SAVES}
        onHanded = () => conn.signIn.abort("signed out"); // signed out as the first is handed over
        await Promise.all(["a.txt", "b.txt", "c.txt"].map((name) => files.download(name, name)));
        const ended = lines();
        conn.signIn = new AbortController(); // the next sign-in
        onHanded = () => {{}};
        const asked = performance.now();
        await files.download("d.txt", "d.txt");
        return {{ handed, ended, next: lines()["d.txt"], waited: performance.now() - asked }};
    }}""")
    assert seen["handed"] == ["a.txt", "d.txt"], seen
    assert seen["ended"] == {"a.txt": "downloaded", "b.txt": "stopped: signed out; download it again",
                             "c.txt": "stopped: signed out; download it again"}, seen
    assert seen["next"] == "downloaded" and seen["waited"] < 1_000, seen


def _seven_scans(server: SpriteOS) -> tuple[Path, list[str]]:
    """A folder `scans` of seven files, scan-1.pdf to scan-7.pdf, made last to first (the disk's order is not
    the names'), and their names in order."""
    folder = server.settings.layout.root / "scans"
    folder.mkdir()
    names = [f"scan-{n}.pdf" for n in range(1, 8)]
    for name in reversed(names):
        (folder / name).write_text("x")
    return folder, names


async def _open_paged(tab: Any, monkeypatch: pytest.MonkeyPatch, name: str) -> Any:
    """Open folder `name` from the Files view with a listing of 3 (the top listing drawn first, at its full
    size: a small one could leave the folder out) and return its rows, the first page shown."""
    await tab.by("files-tab").click()
    opener = tab.page.locator(f'[data-name="{name}"]').get_by_test_id("open-folder")
    await expect(opener).to_have_count(1)
    monkeypatch.setattr(user_files, "MAX_ENTRIES", 3)
    await opener.click()
    rows = tab.by("file-entry")
    await expect(rows).to_have_count(3)
    return rows


async def test_a_folder_bigger_than_a_listing_is_shown_a_page_at_a_time_in_order(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder with more files than one listing holds (2,000; 3 here): the first page is the folder's
    first in order, and Show the next brings the rest, by keyboard too, so every file can be downloaded
    (it said "Showing 2000 of 3000." of whichever the disk gave first, and the rest were out of reach)."""
    _, names = _seven_scans(server)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        rows = await _open_paged(tab, monkeypatch, "scans")
        await expect(tab.by("files-more")).to_have_text("Showing 3 of 7. Show the next 3")
        await tab.by("files-more-button").focus()
        await tab.page.keyboard.press("Enter")
        await expect(rows).to_have_count(6)
        await expect(tab.page.locator(":focus")).to_have_attribute("aria-label", "Download scan-4.pdf")
        await tab.by("files-more-button").click()
        await expect(rows).to_have_count(7)
        await expect(tab.by("files-more")).to_have_count(0)
        assert [await row.get_attribute("data-name") for row in await rows.all()] == names
        tab.assert_clean()


async def test_a_folder_that_changes_between_its_pages_skips_none_of_its_files(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A big folder's next page is asked after the last file shown, not from a count: a file removed from
    the first page meanwhile moved the next one up past the count (scan-4 here), never shown, nor could it
    be downloaded; and one added above the page kept Show the next asking for ever for a file already shown."""
    folder, names = _seven_scans(server)
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        rows = await _open_paged(tab, monkeypatch, "scans")
        (folder / "scan-1.pdf").unlink()
        await tab.by("files-more-button").click()
        await expect(rows).to_have_count(6)
        await expect(tab.by("files-more")).to_have_text("Showing 6 of 7. Show the next 1")
        (folder / "scan-0.pdf").write_text("x")
        await tab.by("files-more-button").click()
        await expect(rows).to_have_count(7)
        await expect(tab.by("files-more")).to_have_count(0)
        assert [await row.get_attribute("data-name") for row in await rows.all()] == names
        tab.assert_clean()


async def test_a_big_folder_drawn_again_keeps_the_pages_shown_and_the_focus(
        server: SpriteOS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The person brought the second page of a big folder (Show the next) and is on a file of it when an
    upload redraws the folder: the pages shown are shown again, with the focus still on that file (the
    redraw showed the first page alone, the file and the focus gone with the rest)."""
    folder = server.settings.layout.root / "documents"
    names = [f"scan-{n}.pdf" for n in range(1, 8)]
    for name in names:
        (folder / name).write_text("x")
    picked = tmp_path / "zz-notes.txt"
    picked.write_text("notes")
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        rows = await _open_paged(tab, monkeypatch, "documents")
        await tab.by("files-more-button").click()
        await expect(rows).to_have_count(6)
        scan5 = tab.page.locator('[data-name="scan-5.pdf"]').get_by_test_id("download")
        await scan5.focus()
        await tab.by("upload-input").set_input_files(str(picked))
        await expect(tab.by("files-more")).to_have_text("Showing 6 of 8. Show the next 2")  # drawn again
        await expect(rows).to_have_count(6)
        await expect(scan5).to_be_focused()
        tab.assert_clean()
