"""The conversation is the transcript's, in a real Chromium: a reload and a second device show the
same conversation (from what Sprite OS recorded), a draft survives the reload, each turn shows its
own cost and the session's total, and a past session opens read-only. A dead model proxy is one
retry line and a plain error with a Retry. Real server, real CLI, the mock Bridge."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from devkit.mock_bridge import Fault, MockBridge, Text, Turn
from sprite_os.server import SpriteOS
from tests.console_browser import PHONE, chromium, open_tab, screenshot, screenshot_dir, signed_in

pytestmark = pytest.mark.e2e

SAID = ["Plan my week", "Add the bank call", "And water the plants"]


async def test_reload_and_a_second_device_show_the_recorded_conversation_with_costs_and_past_sessions(
        server: SpriteOS, tmp_path: Path) -> None:
    shots = screenshot_dir(tmp_path)
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await expect(tab.by("composer")).to_be_focused()  # ready to type after signing in
        for text in SAID:
            await tab.send(text)
            await expect(tab.messages("assistant").last).to_contain_text(f"You said: {text}")
        statuses = tab.by("turn-status")
        await expect(statuses).to_have_count(3)
        costs = [float(await s.get_attribute("data-cost")) for s in await statuses.all()]
        totals = [float(await s.get_attribute("data-session-cost")) for s in await statuses.all()]
        assert costs[0] > 0 and costs[1] == pytest.approx(costs[0]) and costs[2] == pytest.approx(costs[0]), costs
        assert totals == pytest.approx([costs[0], costs[0] * 2, sum(costs)])  # the session's total beside each
        await expect(statuses.last).to_contain_text("session $")
        await expect(tab.by("session-cost")).to_contain_text("This session: $")

        await tab.by("composer").fill("a draft I have not sent")
        await tab.page.reload()
        await tab.connected()
        said = tab.messages("user")
        await expect(said).to_have_text(SAID)  # the conversation, from the record
        await expect(tab.messages("assistant")).to_have_text([f"You said: {t}" for t in SAID])
        await expect(statuses).to_have_count(3)
        await expect(statuses.first).to_contain_text("turn $")  # each turn's own cost, as recorded
        await expect(tab.by("composer")).to_have_value("a draft I have not sent")

        phone = await open_tab(browser, tab.base, viewport=PHONE)
        await phone.sign_in()
        await phone.connected()
        # A new device shows the same, each message marked where it came from (the record keeps its client id)
        await expect(phone.messages("user")).to_have_text([f"{t}from another browser or device" for t in SAID])
        await tab.by("composer").fill("")
        await tab.send("From the laptop, live")
        await expect(phone.messages("user").last.locator(".text")).to_have_text("From the laptop, live")
        phone.assert_clean()

        await tab.by("new-session").click()
        await expect(tab.page.locator('[data-kind="session"]').last).to_contain_text("A new session started")
        await tab.send("A fresh start")
        await expect(tab.messages("assistant").last).to_contain_text("You said: A fresh start")
        # the answer's words stream in before the turn is recorded: its status line says it is
        await expect(statuses).to_have_count(5)
        await tab.by("past-sessions").click()
        sessions = tab.by("past-session")
        await expect(sessions).to_have_count(2)
        await expect(sessions.first).to_have_attribute("data-current", "true")  # newest first
        await expect(sessions.first).to_contain_text("A fresh start")
        older = sessions.nth(1)
        await expect(older).to_contain_text("Plan my week")
        await expect(older).to_contain_text("4 turns")
        await screenshot(tab, shots, "past-sessions-light")
        await older.get_by_role("button").click()
        past = tab.by("past-turns")
        await expect(past.locator('[data-role="user"]')).to_have_text([*SAID, "From the laptop, live"])
        await expect(tab.by("composer")).to_be_hidden()  # read only
        await tab.by("past-close").first.click()
        await expect(tab.by("composer")).to_be_visible()
        await expect(tab.messages("user").last).to_have_text("A fresh start")
        tab.assert_clean()


TALL = "\n\n".join(f"Paragraph {n}: " + "words " * 30 for n in range(60))


async def at_latest(tab: object) -> bool:
    return bool(await tab.page.evaluate(  # type: ignore[attr-defined]
        "(() => { const l = document.getElementById('messages'); return l.scrollHeight - l.scrollTop - l.clientHeight < 60; })()"))


async def test_the_chat_follows_a_tall_reply_and_offers_the_latest_when_scrolled_up(
        server: SpriteOS, bridge: MockBridge) -> None:
    """The chat follows a reply far past one screen; a turn sent elsewhere (another tab) while the person
    reads back leaves them where they are, with Jump to the latest; their own message, sent while they
    read back, brings the chat to the bottom, and it follows that reply."""
    bridge.agent.script(*[Turn(Text(TALL, chunk_size=400, chunk_delay=0.02))] * 3)
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.send("Tell me everything")
        replies = tab.messages("assistant")
        await expect(replies.last).to_have_attribute("data-state", "complete")
        await expect(replies.last).to_contain_text("Paragraph 59")
        assert await at_latest(tab)  # it followed the reply as it grew, far past one screen
        await tab.page.evaluate("document.getElementById('messages').scrollTop = 0")  # the person reads back
        other = await signed_in(browser, server.port)
        await other.send("And again")
        await expect(replies).to_have_count(2)
        await expect(replies.last).to_have_attribute("data-state", "complete")
        await expect(tab.by("jump-latest")).to_be_visible()  # not dragged down; offered the latest instead
        assert not await at_latest(tab)
        await tab.by("jump-latest").click()
        assert await at_latest(tab)
        await expect(tab.by("jump-latest")).to_be_hidden()
        await tab.page.evaluate("document.getElementById('messages').scrollTop = 0")  # reads back again
        await expect(tab.by("jump-latest")).to_be_hidden()
        await tab.send("Once more")  # their own message: the chat goes to it, and follows the reply
        await expect(replies).to_have_count(3)
        await expect(replies.last).to_have_attribute("data-state", "complete")
        assert await at_latest(tab)
        await expect(tab.by("jump-latest")).to_be_hidden()
        tab.assert_clean()
        other.assert_clean()


async def test_a_dead_model_proxy_is_one_retry_line_then_a_plain_error_with_a_retry(
        server: SpriteOS, bridge: MockBridge, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "2")  # the CLI inherits it: two retries, then it gives up
    shots = screenshot_dir(tmp_path)
    down = bridge.faults.add(Fault("status", status=502, target="agent"))
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.sign_in()
        await tab.connected()
        await tab.send("Summarise my invoices")
        failure = tab.page.locator('[data-testid="notice"][data-code="model_unavailable"]')
        await expect(failure).to_contain_text("The model proxy can't be reached.")
        retries = tab.by("retry-line")
        await expect(retries).to_have_count(1)  # one line, updated in place
        await expect(retries).to_have_attribute("data-attempt", "2")
        await expect(failure.get_by_test_id("error-detail")).to_be_hidden()  # the CLI's words, folded away
        await failure.locator("summary").click()
        await expect(failure.get_by_test_id("error-detail")).to_contain_text("502")
        await expect(tab.messages("assistant")).to_have_count(0)  # "API Error: ..." is no reply
        await expect(tab.by("turn-status").last).to_have_attribute("data-status", "error")
        await screenshot(tab, shots, "chat-proxy-down-light")
        bridge.faults.remove(down)
        await failure.get_by_test_id("retry").click()
        await expect(tab.messages("assistant").last).to_contain_text("You said: Summarise my invoices")
        await expect(tab.messages("user")).to_have_text(["Summarise my invoices", "Summarise my invoices"])
        tab.assert_clean()
