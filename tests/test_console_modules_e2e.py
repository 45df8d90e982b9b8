"""The console's JavaScript modules on their own, in a real Chromium page: each view or the connection
driven by frames the test writes (a fake connection, or a fake WebSocket), no CLI and no turn. What a
person would see after a given order of events, proven without the cost of making the Sprite produce it
(rule 5 of tests/README.md)."""

from __future__ import annotations

from typing import Any

import pytest

from sprite_os.server import SpriteOS
from tests.console_browser import chromium, open_tab

pytestmark = pytest.mark.e2e


async def in_page(server: SpriteOS, script: str) -> Any:
    """`script` (an async arrow function) run in a page of the console (its modules importable), signed out."""
    async with chromium() as browser:
        tab = await open_tab(browser, f"http://127.0.0.1:{server.port}/")
        await tab.page.goto(tab.base)
        result = await tab.page.evaluate(script)
        tab.assert_clean()
        return result


# A ChatView of the test's own, on a fake connection that sends everything and answers the record's page
# with no turns; `ready()` gives it a fresh snapshot; `rows()` reads the conversation as a person does.
CHAT = """
const { ChatView } = await import("/console/js/chat.js");
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
const ready = () => chat.handle({ type: "ready", stream: "run-1", session_id: "s1", agent: "idle", waiting: [], cards: [] });
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
