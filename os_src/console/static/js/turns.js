// The pieces of a turn as the conversation shows them, live or from the record: the person's
// message, each tool call folded to a line, the agent's answer, and the line under the turn
// (how it ended, what it cost). The live chat and a past session's read-only view share them.

import { clear, count, dollars, el, when } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const TOOL_LINE = 90; // characters of a tool call's summary shown folded
// How long the page waits for forget_turns: a forget answers once the words are out of the transcript,
// the databases and the index (under a second on a quiet Sprite; it first waits up to 5 s for turns
// still being written, and a big index's purge takes longer), and deciding the memory-file lines
// runs after the answer. A minute leaves room for a loaded machine; the usual timeout does not.
export const FORGET_TIMEOUT = 60_000;

/** A message of the conversation: role is "user", "assistant" or "tool". */
export function messageItem(role, body, meta) {
  return el("li", { class: `msg ${role}`, testid: "message", dataset: { role } },
    el("div", { class: "body" }, body), meta ? el("div", { class: "meta", text: meta }) : null);
}

/** The person's words, in the direction they were written in (dir=auto: an override can't disguise them). */
export function userText(text) {
  return el("div", { class: "text", dir: "auto", text });
}

export function answerBody(text) {
  return el("div", { class: "text markdown", dir: "auto" }, renderMarkdown(text));
}

/** A tool call, folded to one line; `result` fills it in once known. */
export function toolItem(name, summary) {
  const line = summary.length > TOOL_LINE ? `${summary.slice(0, TOOL_LINE)}…` : summary;
  const mark = el("span", { class: "mark", text: "⋯", "aria-hidden": "true" });
  const state = el("span", { class: "visually-hidden", text: "running: " });
  const details = el("details", {},
    el("summary", {}, mark, state, el("strong", { text: ` ${name} ` }), el("span", { class: "summary", dir: "auto", text: line })),
    el("div", { class: "label", text: "call" }), el("pre", { dir: "auto", tabindex: "0", text: summary }));
  const item = messageItem("tool", details);
  return { item, result(isError, output) {
    mark.textContent = isError ? "✗" : "✓";
    state.textContent = isError ? "failed: " : "done: ";
    item.dataset.state = isError ? "error" : "done";
    details.append(el("div", { class: "label", text: isError ? "error" : "result" }), el("pre", { dir: "auto", tabindex: "0", text: output }));
  } };
}

/** The line under a turn: how it ended, how long it took, its own cost and the session's, its tokens. */
export function statusItem({ status, duration_ms: ms, cost_usd: cost, session_cost_usd: total, usage, at }) {
  const said = status === "stopped" ? "stopped by the server" : status; // a past turn the server's stop or restart cut short
  const parts = [ms !== undefined && ms !== null ? `${said} in ${(ms / 1000).toFixed(1)} s` : said || "recorded"];
  if (at) parts.push(when(at));
  if (cost) parts.push(`turn ${dollars(cost)}`);
  if (total) parts.push(`session ${dollars(total)}`);
  const u = usage || {};
  if (u.input_tokens || u.output_tokens) parts.push(`${count(u.input_tokens)} in · ${count(u.output_tokens)} out tokens`);
  return el("li", { class: `turn-status ${status || ""}`, testid: "turn-status", text: parts.join(" · "),
    dataset: { status: status || "", cost: cost ?? "", sessionCost: total ?? "" } });
}

/** What a person can do about a failed turn: plain words, a Retry, and the CLI's own words folded away. */
export function failureItem({ code, message, detail }, retry) {
  return el("li", { class: "notice error failure", testid: "notice", dataset: { kind: "error", code } },
    el("strong", { role: "alert", text: message }),
    retry ? el("button", { type: "button", class: "retry", testid: "retry", text: "Retry", onclick: retry }) : null,
    detail ? el("details", { class: "detail" }, el("summary", { text: "Details" }), el("pre", { testid: "error-detail", tabindex: "0", text: detail })) : null);
}

/** A model proxy that failed, in the words a person can act on (as the server words its errors). */
export function proxyTrouble(status) {
  if (!status || status === 502) return "The model proxy can't be reached";
  if (status === 529) return "The model is overloaded";
  if (status === 429) return "The model proxy is limiting requests";
  if (status === 504) return "The model proxy did not answer in time";
  return `The model proxy failed (HTTP ${status})`;
}

/** Where a forgotten turn was: when, never what. */
export function tombstone(at) {
  return el("li", { class: "notice forgotten", testid: "tombstone", text: `A turn was forgotten here (${when(at)}): its words are gone.` });
}

/** "Forget…", then a plain question and the two answers, in place: forgetting can't be undone.
 * `forget()` resolves false when it was refused (said by its caller): "Forget…" is offered again. */
export function forgetControl(what, forget) {
  const box = el("span", { class: "forget" });
  const ask = () => {
    const yes = el("button", { type: "button", class: "danger", testid: "forget-confirm", text: "Forget for good", onclick: () => {
      box.textContent = "forgetting…";
      box.tabIndex = -1; // the keyboard's place while it is done (the tombstone takes it after)
      box.focus();
      Promise.resolve(forget()).then((done) => {
        if (done !== false || !box.isConnected) return;
        const refocus = box.contains(document.activeElement); // the box itself too
        clear(box).append(start);
        box.removeAttribute("tabindex");
        if (refocus) start.focus();
      });
    } });
    const no = el("button", { type: "button", testid: "forget-cancel", text: "Keep", onclick: () => { clear(box).append(start); start.focus(); } });
    clear(box).append(el("span", { text: `Forget ${what}? Its words leave the transcript, search and memory; this can't be undone. ` }), yes, " ", no);
    yes.focus();
  };
  const start = el("button", { type: "button", class: "link", testid: "forget-turn", text: `Forget ${what}…`, onclick: ask });
  return box.append(start), box;
}

/** A recorded turn (session_turns), as the list items the conversation shows; `from` says where its
 * message came from, by its client id (nothing: the page's own, or it cannot tell). */
export function pastTurnItems(turn, { retry, forget, session, from } = {}) {
  const mark = (item) => {
    item.dataset.turnId = turn.turn_id || "";
    item.dataset.turn = String(turn.turn);
    if (session) item.dataset.session = session;
    return item;
  };
  if (turn.forgotten_at) return [mark(tombstone(turn.forgotten_at))];
  const items = [mark(messageItem("user", userText(turn.user_message), from?.(turn.client_id)))];
  items[0].dataset.state = "started";
  for (const call of turn.tool_calls) {
    const tool = toolItem(call.name, call.input);
    tool.result(call.is_error, call.output);
    items.push(mark(tool.item));
  }
  if (turn.status === "error") {
    items.push(mark(failureItem({ code: "agent_failed", message: "This turn failed before the agent finished.", detail: turn.agent_response },
      retry ? () => retry(turn.user_message) : null)));
  } else if (turn.agent_response) {
    const answer = mark(messageItem("assistant", answerBody(turn.agent_response)));
    answer.dataset.state = "complete";
    items.push(answer);
  }
  const status = mark(statusItem({ status: turn.status || "recorded", cost_usd: turn.cost_usd, at: turn.at }));
  if (forget) {
    const which = turn.observation_id ? { observation_ids: [turn.observation_id] } : { turn_ids: [turn.turn_id] };
    status.append(" · ", forgetControl("this turn", () => forget(which)));
  }
  items.push(status);
  return items;
}

/** Replace the items of forgotten turns (by wire id, or by number within `session`) with one tombstone each. */
export function buryTurns(list, frame) {
  const groups = [
    ...frame.turn_ids.map((id) => [...list.querySelectorAll(`[data-turn-id="${CSS.escape(id)}"]`)]),
    ...frame.turns.map((n) => [...list.querySelectorAll(`[data-session="${CSS.escape(frame.session_id)}"][data-turn="${n}"]`)]),
  ];
  for (const items of groups) {
    const alive = items.filter((item) => item.isConnected && item.dataset.testid !== "tombstone");
    if (!alive.length) continue;
    const stone = tombstone(frame.forgotten_at);
    Object.assign(stone.dataset, { turnId: alive[0].dataset.turnId || "", turn: alive[0].dataset.turn || "", session: alive[0].dataset.session || "" });
    const hadFocus = alive.some((item) => item.contains(document.activeElement)); // its Forget, pressed here
    alive[0].replaceWith(stone);
    for (const item of alive.slice(1)) item.remove();
    if (hadFocus) { stone.tabIndex = -1; stone.focus(); }
  }
}
