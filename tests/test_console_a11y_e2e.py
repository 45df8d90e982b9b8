"""A page anyone can use, in a real Chromium: axe-core (from the axe-playwright-python wheel, no
network) finds no serious or critical violation on any view, in the light theme and the dark,
on a desktop and a phone; and every action of a person's day works from the keyboard alone.
Real server, real CLI, the mock Bridge."""

from __future__ import annotations

from pathlib import Path

import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import expect

from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.server import SpriteOS
from tests.conftest import TOKEN, wait_for
from tests.console_browser import PHONE, Tab, chromium, install_templates, open_tab, signed_in

pytestmark = pytest.mark.e2e

SERIOUS = ("serious", "critical")
AXE_SCRIPT = Axe().axe_script  # axe-core itself, some 570 kB of JavaScript

# axe, put into the page once (not again at each view: each time costs the page some 50 ms of CPU to
# read), with the rules off that can find nothing serious or critical: a finding's impact is its rule's
# or one of its failed checks' (axe's own metadata), so a rule whose impact and every check's are below
# "serious" can only add a finding that `violations` drops (the landmark rules, `region`, which walks
# the whole page, `heading-order`...). Only those are turned off; a check axe has no metadata for keeps
# its rule on.
_RUN_AXE = """async (serious) => {
  if (!window.__axeRules) {
    const grave = (impact) => serious.includes(impact);
    window.__axeRules = {};
    for (const rule of axe._audit.rules) {
      const checks = [...rule.any, ...rule.all, ...rule.none].map((c) => axe._audit.data.checks[c.id || c]);
      if (!grave(rule.impact) && !checks.some((check) => !check || grave(check.impact))) {
        window.__axeRules[rule.id] = {enabled: false};
      }
    }
  }
  return (await axe.run(document, {resultTypes: ["violations"], rules: window.__axeRules})).violations;
}"""


async def violations(tab: Tab, view: str) -> list[str]:
    """What axe finds serious or critical on the page as it is now, one line each."""
    if not await tab.page.evaluate("typeof window.axe?.run === 'function'"):  # a page loaded since: axe again
        await tab.page.evaluate(AXE_SCRIPT)
    found = await tab.page.evaluate(_RUN_AXE, list(SERIOUS))
    return [f"{view}: {v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
            for v in found if v["impact"] in SERIOUS]


async def every_view(tab: Tab) -> list[str]:
    """Each view and panel of the console, opened as a person would, checked in turn."""
    out: list[str] = []
    page = tab.page
    out += await violations(tab, "chat")
    await tab.by("past-sessions").click()
    await expect(tab.by("past-session").first).to_be_visible()
    out += await violations(tab, "past sessions")
    await tab.by("past-session").last.get_by_role("button").click()
    await expect(tab.by("past-turns").locator('[data-role="user"]').first).to_be_visible()
    out += await violations(tab, "a past session")
    await tab.by("past-close").first.click()
    await tab.by("canvas-tab").click()
    out += await violations(tab, "canvas")
    await tab.by("card").first.get_by_test_id("card-expand").click()
    out += await violations(tab, "a card opened large")
    await page.keyboard.press("Escape")
    await tab.by("files-tab").click()
    await expect(tab.by("file-entry").first).to_be_visible()
    out += await violations(tab, "files")
    for section in ("files", "learnings", "health", "boot"):
        await tab.memory(section)
        out += await violations(tab, f"memory {section}")
    await tab.by("memory-section-files").click()
    # the section's load renders the file again, and with it an empty version view: the diff opened before is gone
    await expect(tab.by("memory-panel-files")).not_to_have_attribute("data-loading", "true")
    await tab.by("file-version").last.get_by_role("button").click()
    await expect(tab.by("file-diff")).to_be_visible()
    await tab.by("file-edit").click()
    out += await violations(tab, "memory file history and editor")
    await tab.by("file-cancel").click()
    await tab.by("chat-tab").click()
    return out


async def test_no_serious_or_critical_violation_on_any_view(server: SpriteOS, bridge: MockBridge,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    install_templates(server.settings)
    await _forget_cut_short(server, monkeypatch)  # Health shows "Forgetting is stuck", in red, with its long line
    MemoryFiles(server.settings.layout).write("user.md", "# User\n- Name: Ada\n", "batch-1")
    (server.settings.layout.root / "documents" / "lease.txt").write_text("ends 2027")
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"title": "Week", "kind": "task",
                                                                   "body": "- [ ] bank\n- [x] report"}), Text("Done.")))
    found: list[str] = []
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        found += await violations(tab, "sign in")
        await tab.sign_in()
        await tab.connected()
        await tab.send("Put my week on a card")
        await expect(tab.by("card")).to_have_count(1)
        await tab.send("hello \u202etxt.exe")  # dir="auto" keeps an override from disguising what was said
        await expect(tab.messages("assistant").last).to_contain_text("You said:")
        down = bridge.faults.add(Fault("status", status=400, target="agent"))  # a failure, with its Retry
        await tab.send("and this fails")
        await expect(tab.by("retry")).to_be_visible()
        bridge.faults.remove(down)
        assert await tab.messages("user").last.locator(".text").get_attribute("dir") == "auto"
        found += await every_view(tab)
        await tab.by("theme-toggle").click()
        await expect(tab.page.locator("html")).to_have_attribute("data-theme", "dark")
        found += [f"dark {v}" for v in await every_view(tab)]
        phone = await open_tab(browser, tab.base, viewport=PHONE)
        await phone.sign_in()
        await phone.connected()
        await expect(phone.messages("user").first).to_be_visible()
        found += [f"phone {v}" for v in await violations(phone, "chat")]
        await phone.memory("files")
        await phone.by("memory-file").filter(has_text="user.md").get_by_role("button").click()
        await expect(phone.by("file-text")).to_be_in_viewport()  # on a phone the file opens where the eye is
        found += [f"phone {v}" for v in await violations(phone, "memory files")]
        await phone.memory("health")
        await expect(phone.by("memory-forgets")).to_contain_text("Forgetting is stuck")
        found += [f"phone {v}" for v in await violations(phone, "memory health")]
        tab.assert_clean("400")
    assert found == [], "\n".join(found)


async def _forget_cut_short(server: SpriteOS, monkeypatch: pytest.MonkeyPatch) -> None:
    """A past session's turn whose forget a disk error cut short, counted."""
    memory = server.memory
    assert memory is not None

    def write(t: TranscriptDB) -> int:
        t.start_session("s-a11y-cut", 1_781_524_800.0)
        return t.append(NewObservation(2.0, "s-a11y-cut", 1, "a turn to forget", "[]", "Noted.")) or 0

    turn = await memory.transcript.call(write)

    def failing(*_: object) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(TranscriptDB, "forget", failing)
        with pytest.raises(OSError):
            await memory.forget_turns([turn], by="test")
    assert memory.forgetting.status(0.0)["degraded"]


# What moves on the page, each in the state that makes it move: the agent's dot while it works, the cursor of
# an answer being streamed, a new card's glow. Their animations' names, as the page computes them.
_MOVING = """() => {
  const agent = document.getElementById("agent-state");
  agent.dataset.state = "running";
  const msg = document.createElement("li");
  msg.className = "msg assistant";
  msg.dataset.state = "streaming";
  const body = msg.appendChild(document.createElement("div"));
  body.className = "body";
  const card = document.createElement("article");
  card.className = "card fresh";
  document.body.append(msg, card);
  const names = [getComputedStyle(agent, "::before").animationName, getComputedStyle(body, "::after").animationName,
                 getComputedStyle(card).animationName];
  msg.remove();
  card.remove();
  return names;
}"""


async def test_a_person_who_asked_for_less_motion_gets_none(server: SpriteOS) -> None:
    """The agent's dot pulses for as long as it works (minutes, some turns): a person whose system asks for
    reduced motion gets it still, and the cursor and a new card's glow too; the states are said in words
    as well ("working…"). Without that setting they move, as before."""
    async with chromium() as browser:
        tab = await signed_in(browser, server.port)
        await tab.page.emulate_media(reduced_motion="no-preference")
        assert await tab.page.evaluate(_MOVING) == ["pulse", "pulse", "arrive"]
        await tab.page.emulate_media(reduced_motion="reduce")
        assert await tab.page.evaluate(_MOVING) == ["none", "none", "none"]
        tab.assert_clean()


async def tab_to(tab: Tab, testid: str, limit: int = 60, backwards: bool = False) -> None:
    """Press Tab (or Shift+Tab) until the element with `testid` has the focus: it is reachable."""
    for _ in range(limit):
        if await tab.page.evaluate("document.activeElement?.dataset?.testid") == testid:
            return
        await tab.page.keyboard.press("Shift+Tab" if backwards else "Tab")
    raise AssertionError(f"{testid} is not reachable with the keyboard")


async def test_every_action_works_from_the_keyboard_alone(server: SpriteOS, bridge: MockBridge, tmp_path: Path) -> None:
    install_templates(server.settings)
    MemoryFiles(server.settings.layout).write("user.md", "# User\n- Name: Ada\n", "batch-1")
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"title": "Errands", "body": "- bank"}),
                             Text("On the canvas.")))
    upload = tmp_path / "notes.txt"
    upload.write_text("from the keyboard")
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        # Playwright intercepts file choosers only once the page has a listener for them, and turns that
        # on without waiting: left to expect_file_chooser, the Enter below could open the picker first
        # (about one time in seven under load), and the chooser never came.
        tab.page.on("filechooser", lambda _chooser: None)
        keys = tab.page.keyboard
        await tab.page.goto(tab.base)
        await keys.type(TOKEN)  # the token box has the focus
        await keys.press("Enter")
        await tab.connected()
        await keys.type("Put my errands on a card")  # and then the composer has it
        await keys.press("Enter")
        await expect(tab.by("card")).to_have_count(1)
        await expect(tab.messages("assistant").last).to_contain_text("On the canvas.")
        # the words stream in before the turn is recorded: its status line says it is, and only then
        # does Past sessions list the session
        await expect(tab.by("turn-status")).to_have_count(1)

        await tab_to(tab, "past-sessions")
        await keys.press("Enter")
        await expect(tab.by("past-session")).to_have_count(1)
        await keys.press("Escape")
        await expect(tab.by("past-panel")).to_be_hidden()
        await expect(tab.by("past-sessions")).to_be_focused()

        await tab_to(tab, "card-copy")
        await tab_to(tab, "card-expand", backwards=True)
        await keys.press("Enter")
        await expect(tab.by("card-dialog")).to_be_visible()
        await keys.press("Escape")
        await tab_to(tab, "card-close")
        await keys.press("Enter")
        await expect(tab.by("card")).to_have_count(0)

        await tab_to(tab, "forget-turn", backwards=True)
        await keys.press("Enter")
        await expect(tab.by("forget-confirm")).to_be_focused()
        await keys.press("Tab")
        await keys.press("Enter")  # Keep: nothing is forgotten
        await expect(tab.by("forget-turn").last).to_be_focused()

        await tab_to(tab, "chat-tab", backwards=True)
        await keys.press("ArrowRight")  # the tabs: arrows move between them
        await keys.press("ArrowRight")
        await expect(tab.by("files-view")).to_be_visible()
        await tab_to(tab, "upload-button")
        async with tab.page.expect_file_chooser() as chooser:
            await keys.press("Enter")
        await (await chooser.value).set_files(str(upload))
        await expect(tab.by("upload").first).to_have_attribute("data-state", "done")
        await tab_to(tab, "open-folder")
        await keys.press("Enter")
        await expect(tab.by("files-view")).to_have_attribute("data-path", "artifacts")

        await tab_to(tab, "files-tab", backwards=True)
        await keys.press("ArrowRight")
        await expect(tab.by("memory-view")).to_be_visible()
        await tab_to(tab, "memory-section-files")
        await keys.press("ArrowRight")  # to Learnings
        await expect(tab.by("memory-panel-learnings")).to_be_visible()
        await keys.press("ArrowLeft")
        await expect(tab.by("memory-panel-files")).not_to_have_attribute("data-loading", "true")
        await tab_to(tab, "file-edit")
        await keys.press("Enter")
        await tab_to(tab, "file-editor")
        await keys.press("End")
        await keys.press("Control+End")
        await keys.type("- Tea in the morning\n")
        await tab_to(tab, "file-save")
        await keys.press("Enter")
        await expect(tab.by("memory-flash")).to_contain_text("Saved user.md")
        await wait_for(lambda: "Tea in the morning" in MemoryFiles(server.settings.layout).read("user.md"), timeout=10)
        tab.assert_clean()

