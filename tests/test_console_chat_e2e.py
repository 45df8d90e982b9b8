"""The console in a real Chromium: signing in, the streamed conversation, cards live and after
a reload, interrupt and new session, hostile text rendered as text, a wrong token, and a
dropped connection. Real server, real CLI, the mock Bridge."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from playwright.async_api import expect

from devkit.harness import restartable
from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os.config import Settings
from sprite_os.server import SpriteOS
from tests.conftest import TOKEN, client_factory, wait_for
from tests.console_browser import PHONE, chromium, open_tab, screenshot, screenshot_dir, signed_in

pytestmark = pytest.mark.e2e

WEEK = ("## Monday\n- [x] write the report\n- [ ] call the bank\n\n| day | focus |\n|---|---|\n"
        "| Tue | taxes |\n| Wed | garden |")
CREATE, UPDATE, CLOSE = (f"mcp__canvas__{verb}_card" for verb in ("create", "update", "close"))
PLAN = "Here is a **plan** for `Monday`:\n- write the report\n- call the bank\n\n" + " ".join(
    f"word{n}" for n in range(40))


async def test_sign_in_stream_a_reply_see_a_card_and_keep_it_after_a_reload(
        server: SpriteOS, bridge: MockBridge, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        assert TOKEN not in tab.page.url
        assert await tab.page.evaluate("sessionStorage.getItem('sprite-os.token')") == TOKEN

        bridge.agent.script(Turn(Text(PLAN, chunk_delay=0.05)))
        await tab.send("Plan my Monday")
        reply = tab.messages("assistant").last
        await expect(reply).to_have_attribute("data-state", "streaming")  # seen while it streams
        await expect(reply).to_have_attribute("data-state", "complete")
        await expect(reply.locator("strong")).to_have_text("plan")  # markdown, built as DOM nodes
        await expect(reply.locator("li")).to_have_count(2)
        await expect(reply).to_contain_text("word39")
        status = tab.by("turn-status").last
        await expect(status).to_have_attribute("data-status", "completed")
        await expect(status).to_contain_text("$")  # the turn's cost

        await tab.send("card: Groceries")
        card = tab.by("card")
        await expect(card).to_have_count(1)
        await expect(card.locator(".title")).to_have_text("Groceries")
        tool = tab.messages("tool").last
        await expect(tool).to_have_attribute("data-state", "done")
        await expect(tool.locator("summary")).to_contain_text("mcp__canvas__create_card")
        await expect(tab.by("card-count")).to_have_text("1")

        bridge.agent.script(Turn(ToolCall(CREATE, {"id": "week", "title": "Week plan", "kind": "task", "body": WEEK}),
                                 ToolCall(CREATE, {"id": "scratch", "title": "Scratch", "body": "for now"}),
                                 Text("Your week is on the canvas.")))
        await tab.send("Put my week on the canvas")
        await expect(card).to_have_count(3)
        week = tab.page.locator('[data-testid="card"][data-card-id="week"]')
        await expect(week.locator("tbody tr")).to_have_count(2)  # the body's table, as a table
        bridge.agent.script(Turn(ToolCall(UPDATE, {"id": "week", "body": WEEK + "\n\n- [ ] water the plants"}),
                                 ToolCall(CLOSE, {"id": "scratch"}), Text("Updated, and the scratch card is gone.")))
        await tab.send("Add watering, and drop the scratch card")
        await expect(week).to_contain_text("water the plants")  # updated live
        await expect(card).to_have_count(2)  # closed live
        await expect(tab.by("card-count")).to_have_text("2")
        await expect(tab.by("turn-status")).to_have_count(4)
        await screenshot(tab, shots, "chat-light")
        await tab.by("theme-toggle").click()
        await expect(tab.page.locator("html")).to_have_attribute("data-theme", "dark")
        await screenshot(tab, shots, "chat-dark")
        await tab.by("canvas-tab").click()
        await screenshot(tab, shots, "canvas-dark")
        await tab.by("theme-toggle").click()
        await screenshot(tab, shots, "canvas-light")

        await tab.page.reload()  # the token is kept for this tab; the cards come back from `ready`
        await tab.connected()
        await expect(tab.by("card")).to_have_count(2)
        await expect(tab.by("card").locator(".title")).to_have_text(["Week plan", "Groceries"])  # newest first
        await expect(week).to_contain_text("water the plants")
        tab.assert_clean()

        phone = await open_tab(browser, tab.base, viewport=PHONE, dark=True)
        await phone.sign_in()
        await phone.connected()
        await expect(phone.by("card-count")).to_have_text("2")
        await phone.send("Hello from my phone")
        await expect(phone.messages("assistant").last).to_contain_text("You said: Hello from my phone")
        await screenshot(phone, shots, "phone-chat-dark")
        await expect(tab.messages("user").last).to_contain_text("Hello from my phone")  # every device sees it
        phone.assert_clean()


async def test_interrupt_and_new_session(server: SpriteOS, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text(" ".join(["slowly"] * 200), chunk_delay=0.1)))
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.send("Tell me a very long story")
        await expect(tab.messages("assistant").last).to_have_attribute("data-state", "streaming")
        await expect(tab.by("agent-state")).to_have_attribute("data-state", "running")
        await tab.by("interrupt").click()
        await expect(tab.by("turn-status").last).to_have_attribute("data-status", "interrupted")
        await expect(tab.by("interrupt")).to_be_disabled()
        await tab.by("new-session").click()
        notices = tab.page.locator('[data-testid="notice"][data-kind="session"]')
        await expect(notices.first).to_contain_text("The session ended (new session)")
        await expect(notices.last).to_contain_text("A new session started")
        tab.assert_clean()


async def test_a_turn_the_servers_stop_cuts_short_says_so_not_interrupted(settings: Settings, bridge: MockBridge) -> None:
    """The server's stop ended the running turn: the page said "interrupted", as if the person had
    pressed Stop, while its record (and Past sessions) said the server stopped it."""
    bridge.agent.script(Turn(Text(" ".join(["slowly"] * 200), chunk_delay=0.1)))
    async with restartable(settings) as server, chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.send("Tell me a very long story")
        await expect(tab.messages("assistant").last).to_have_attribute("data-state", "streaming")
        await server.stop()
        status = tab.by("turn-status").last
        await expect(status).to_have_attribute("data-status", "stopped")
        await expect(status).to_contain_text("stopped by the server")
        tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED")


XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script><b onmouseover="window.__xss=3">b</b>'


async def test_html_from_a_person_the_model_or_a_card_is_shown_as_text(server: SpriteOS, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text(f"Model says {XSS} and [click me](javascript:window.__xss=4)")))
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {
        "title": f"Card {XSS}", "body": f"# {XSS}\n- {XSS}\n[open](javascript:window.__xss=5)\n\n`{XSS}`",
        "kind": "alert"}), Text("The card is up.")))
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.send(f"User says {XSS}")
        await expect(tab.messages("user").last.locator(".text")).to_have_text(f"User says {XSS}")
        await expect(tab.messages("assistant").last).to_contain_text(f"Model says {XSS}")
        await tab.send("Put it on a card")
        card = tab.by("card")
        await expect(card.locator(".title")).to_have_text(f"Card {XSS}")
        await expect(card.locator("li")).to_have_text(XSS)
        await expect(card.locator("code")).to_have_text(XSS)
        await expect(tab.messages("assistant").last).to_contain_text("The card is up.")
        page = tab.page
        await page.mouse.move(0, 0)
        for b in await page.locator("b").all():
            await b.hover()
        assert await page.evaluate("window.__xss") is None  # no payload ran
        assert await page.locator("img").count() == 0
        assert await page.locator("script").count() == 1  # the console's own module, nothing injected
        assert await page.locator("[onerror], [onmouseover]").count() == 0
        assert await page.locator("a").count() == 0  # javascript: links stay text
        await expect(card).to_contain_text("[open](javascript:window.__xss=5)")
        tab.assert_clean()


async def test_a_wrong_token_is_said_plainly_and_not_retried(server: SpriteOS) -> None:
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in("not-the-token-0123456789")
        await expect(tab.by("login-error")).to_contain_text("refused this token")
        await expect(tab.by("connection-status")).to_have_attribute("data-state", "auth-failed")
        assert (len(tab.sockets), tab.auth_checks) == (1, 1)
        # A retry would come within 0.5 s (the first backoff step); watch four times that long.
        await tab.page.wait_for_timeout(2000)
        assert (len(tab.sockets), tab.auth_checks) == (1, 1)
        assert await tab.page.evaluate("sessionStorage.getItem('sprite-os.token')") is None
        await tab.sign_in()  # the right one works at once
        await tab.connected()
        tab.assert_clean("401", "WebSocket connection")


# Before the page's own scripts: the browser denies the page its storage, as Chrome does with all cookies
# blocked (reading `sessionStorage` or `localStorage` itself throws).
STORAGE_DENIED = """
for (const name of ["sessionStorage", "localStorage"]) {
  Object.defineProperty(window, name, { configurable: true, get() {
    throw new DOMException(`Failed to read the '${name}' property from 'Window': Access is denied for this document.`, "SecurityError");
  } });
}
"""


async def test_a_browser_that_denies_the_page_its_storage_signs_in_and_chats(server: SpriteOS) -> None:
    """A browser that blocks site storage (reading `window.sessionStorage` throws a SecurityError): the
    page failed at its start (the draft), and the sign-in at keeping the token. It signs in (the token lives
    for the page only), chats and says nothing alarming; a reload asks for the token again."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.context.add_init_script(STORAGE_DENIED)
        await tab.sign_in()
        await tab.connected()
        await tab.send("Hello without storage")
        await expect(tab.messages("assistant").last).to_contain_text("You said: Hello without storage")
        await expect(tab.by("turn-status").last).to_have_attribute("data-status", "completed")
        await tab.by("theme-toggle").click()  # the theme changes for the page, kept nowhere
        await expect(tab.by("theme-toggle")).to_have_attribute("aria-pressed", "true")
        await tab.page.reload()
        await expect(tab.by("token-input")).to_be_visible()
        tab.assert_clean()


async def test_a_dropped_connection_resumes_and_a_server_away_is_retried_with_backoff(
        settings: Settings, bridge: MockBridge) -> None:
    app: SpriteOS | None = SpriteOS(settings, TOKEN)
    assert app is not None
    await app.start()
    port = app.port
    try:
        async with chromium() as browser:
            tab = await open_tab(browser, f"http://127.0.0.1:{port}/")
            await tab.sign_in()
            await tab.connected()
            await tab.send("card: Errands")
            await expect(tab.by("turn-status")).to_have_count(1)

            for conn in list(app.gateway.connections):  # the network drops the page's socket
                conn.ws.transport.abort()
            async with client_factory(port) as connect:
                other = await connect(hello={})
                await other.send(type="user_message", text="Sent while the page was away")
                await other.until("turn_complete")
            await expect(tab.page.locator('[data-kind="reconnected"]')).to_contain_text("Reconnected and resumed")
            await expect(tab.messages("user").filter(has_text="Sent while the page was away")).to_have_count(1)
            await expect(tab.messages("assistant").filter(has_text="You said: Sent while")).to_have_count(1)

            opened, made = len(tab.sockets), len(await tab.socket_times())
            stopping, app = app, None
            await stopping.stop()  # the server goes away: each attempt waits about twice as long as the last
            await wait_for(lambda: len(tab.sockets) >= opened + 4, timeout=40, what="four reconnection attempts")
            times = (await tab.socket_times())[made:made + 4]  # the page's clock: a busy test process hears late
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert all(later >= 1.25 * earlier for earlier, later in itertools.pairwise(gaps)), gaps
            assert 700 <= gaps[0] <= 1600, gaps  # 1 s ± 20 % jitter, plus the failed attempt itself
            await expect(tab.by("connection-status")).to_have_attribute("data-state", "waiting")

            app = SpriteOS(settings.with_overrides(port=port), TOKEN)
            await app.start()
            # Its next attempt would come on its own some 8 s later (the backoff, checked above); the
            # network coming back (`online`) makes the page try at once.
            await tab.page.evaluate("window.dispatchEvent(new Event('online'))")
            await tab.connected()
            await expect(tab.page.locator('[data-kind="reconnected"]').last).to_contain_text("server restarted")
            await expect(tab.by("card")).to_have_count(1)  # the canvas is current after the restart
            await tab.send("Still there?")
            await expect(tab.messages("assistant").last).to_contain_text("You said: Still there?")
            tab.assert_clean("WebSocket connection", "ERR_CONNECTION_REFUSED", "Failed to fetch")
    finally:
        if app is not None:
            await app.stop()


MARKDOWN = [
    ("# Title", "<h3>Title</h3>"),
    ("Some **bold**, _em_, `a<b>`, snake_case_name and window.__x__",
     "<p>Some <strong>bold</strong>, <em>em</em>, <code>a&lt;b&gt;</code>, snake_case_name and window.__x__</p>"),
    ("line one\nline two", "<p>line one<br>line two</p>"),
    ("- [ ] todo\n- [x] done",
     '<ul><li class="task"><span class="box" aria-hidden="true">☐ </span>todo</li>'
     '<li class="task"><span class="box" aria-hidden="true">☑ </span>done</li></ul>'),
    ("1. one\n2. two", "<ol><li>one</li><li>two</li></ol>"),
    ("```\n<script>x</script>\n```", "<pre><code>&lt;script&gt;x&lt;/script&gt;</code></pre>"),
    ("[ok](https://a.example/x) [bad](javascript:alert(1)) see https://b.example/y.",
     '<p><a rel="noopener noreferrer nofollow" target="_blank" href="https://a.example/x">ok</a> '
     '[bad](javascript:alert(1)) see <a rel="noopener noreferrer nofollow" target="_blank" '
     'href="https://b.example/y">https://b.example/y</a>.</p>'),
    ("| a | b |\n|---|---|\n| 1 | **2** |",
     '<div class="table-wrap"><table><thead><tr><th>a</th><th>b</th></tr></thead>'
     "<tbody><tr><td>1</td><td><strong>2</strong></td></tr></tbody></table></div>"),
    ("> quoted\n> more", "<blockquote><p>quoted<br>more</p></blockquote>"),
    ("**bold**_em_ [a](https://a.example)__b__", '<p><strong>bold</strong><em>em</em> <a rel="noopener noreferrer '
     'nofollow" target="_blank" href="https://a.example">a</a><strong>b</strong></p>'),  # a match right after another
    ("`a` `b` *c* `d", "<p><code>a</code> <code>b</code> <em>c</em> `d</p>"),
    ("<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
]


async def test_markdown_renders_a_safe_subset_as_nodes(server: SpriteOS) -> None:
    render = """async (text) => {
        const { renderMarkdown } = await import("/console/js/markdown.js");
        const box = document.createElement("div");
        box.append(renderMarkdown(text));
        return box.innerHTML;  // only to read the result back
    }"""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        rendered = [await tab.page.evaluate(render, text) for text, _ in MARKDOWN]
        assert rendered == [html for _, html in MARKDOWN]
        tab.assert_clean()


async def test_markdown_of_hostile_text_renders_at_once_and_whole(server: SpriteOS) -> None:
    """A reply or a card body of 20,000 characters of markers and links never closed (a prompt injection's,
    or text the person pasted, echoed) is drawn in well under a second: each step of the inline markdown
    looked for every rule in the whole rest of the text, each "[" without its "](…)" a scan to its end,
    and the page froze for a minute, and at every load of the conversation after. 5,000 nested quotes are
    drawn 16 deep, the rest as text, where they overflowed the stack and the view failed to draw."""
    timed = """async ([text, quotes]) => {
        const { renderMarkdown } = await import("/console/js/markdown.js");
        const start = performance.now();
        renderMarkdown(text);
        const ms = performance.now() - start;
        const box = document.createElement("div");
        box.append(renderMarkdown(quotes));
        return { ms, depth: box.querySelectorAll("blockquote").length, text: box.textContent.length };
    }"""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        seen = await tab.page.evaluate(timed, ["**`_[a](*" * 2_222, "> " * 5_000 + "deep"])
        # Linear now (tens of ms here); the old scan took about a minute on this text. The bound is that
        # difference, wide enough that a loaded machine's slower run never reaches it.
        assert seen["ms"] < 20_000, seen
        assert seen["depth"] == 16 and seen["text"] == len("> " * (5_000 - 16) + "deep"), seen
        tab.assert_clean()
