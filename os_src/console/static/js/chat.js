// The conversation: messages as they stream, tool calls folded to one line, each turn's
// status and cost, and notices (sessions, reconnections, errors).

import { clear, count, dollars, el } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const TOOL_LINE = 90; // characters of a tool call's summary shown folded

export class ChatView {
  constructor({ list, form, composer, send, interrupt, newSession, agentState }, connection) {
    Object.assign(this, { list, form, composer, sendButton: send, interruptButton: interrupt, agentState });
    this.conn = connection;
    this.queued = new Map(); // client_id -> the message's element, until its turn starts
    this.turns = new Map(); // turn_id -> {stream: element being streamed into, tools: Map}
    this.sent = 0;
    this.running = null; // the running turn's id
    form.addEventListener("submit", (event) => { event.preventDefault(); this.submit(); });
    composer.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); this.submit(); }
    });
    interrupt.addEventListener("click", () => this.command({ type: "interrupt" }));
    newSession.addEventListener("click", () => this.command({ type: "new_session" }));
  }

  submit() {
    const text = this.composer.value;
    if (!text.trim()) return;
    const clientId = `web-${Date.now().toString(36)}-${++this.sent}`;
    if (!this.conn.send({ type: "user_message", text, client_id: clientId })) {
      this.notice("Not connected: your message was not sent. It is still in the box.", "error");
      return;
    }
    this.composer.value = "";
    const message = this.message("user", el("div", { class: "text", text }), "waiting for the agent…");
    message.dataset.state = "queued";
    this.queued.set(clientId, message);
  }

  command(frame) {
    if (!this.conn.send(frame)) this.notice("Not connected right now.", "error");
  }

  message(role, body, meta) {
    const item = el("li", { class: `msg ${role}`, testid: "message", dataset: { role } },
      el("div", { class: "body" }, body), meta ? el("div", { class: "meta", text: meta }) : null);
    return this.add(item);
  }

  notice(text, kind = "info") {
    return this.add(el("li", { class: `notice ${kind}`, testid: "notice", dataset: { kind }, text }));
  }

  add(item) {
    const atBottom = this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 80;
    this.list.append(item);
    if (atBottom) item.scrollIntoView({ block: "end" });
    return item;
  }

  setAgent(state, turnId) {
    this.running = state === "running" || state === "starting" ? turnId : null;
    this.agentState.textContent = this.running ? "working…" : state === "stopping" ? "stopping…" : "idle";
    this.agentState.dataset.state = this.running ? "running" : state;
    this.interruptButton.disabled = !this.running;
  }

  turn(turnId) {
    if (!this.turns.has(turnId)) this.turns.set(turnId, { stream: null, tools: new Map() });
    return this.turns.get(turnId);
  }

  handle(frame) {
    switch (frame.type) {
      case "ready": return this.setAgent(frame.agent, frame.turn_id);
      case "turn_started": return this.started(frame);
      case "text_delta": return this.delta(frame);
      case "assistant_message": return this.assistant(frame);
      case "tool_use": return this.toolUse(frame);
      case "tool_result": return this.toolResult(frame);
      case "turn_complete": return this.completed(frame);
      case "session_started": return this.notice("A new session started: the agent remembers what memory kept.", "session");
      case "session_ended": return this.notice(`The session ended (${frame.reason.replace("_", " ")}).`, "session");
      case "error": return this.error(frame);
      case "model_retry": return this.notice(`The model proxy failed (${frame.error_status ? `HTTP ${frame.error_status}` : "no answer"}); retry ${frame.attempt} of ${frame.max_retries} in ${Math.round(frame.retry_delay_ms / 100) / 10} s.`, "retry");
      default: return undefined;
    }
  }

  started(frame) {
    const mine = frame.client_id ? this.queued.get(frame.client_id) : undefined;
    if (mine) {
      this.queued.delete(frame.client_id);
      mine.dataset.state = "started";
      mine.querySelector(".meta")?.remove();
    } else {
      this.message("user", el("div", { class: "text", text: frame.text }), "from another device").dataset.state = "started";
    }
    this.setAgent("running", frame.turn_id);
  }

  delta(frame) {
    const turn = this.turn(frame.turn_id);
    if (!turn.stream) {
      turn.stream = this.message("assistant", el("div", { class: "text streaming" }));
      turn.stream.dataset.state = "streaming";
    }
    turn.stream.querySelector(".text").append(frame.text);
    if (this.list.scrollHeight - this.list.scrollTop - this.list.clientHeight < 160) turn.stream.scrollIntoView({ block: "end" });
  }

  assistant(frame) {
    const turn = this.turn(frame.turn_id);
    const body = el("div", { class: "text markdown" }, renderMarkdown(frame.text));
    if (turn.stream) {
      clear(turn.stream.querySelector(".body")).append(body);
      turn.stream.dataset.state = "complete";
      turn.stream = null;
    } else {
      this.message("assistant", body).dataset.state = "complete";
    }
  }

  toolUse(frame) {
    const line = frame.summary.length > TOOL_LINE ? `${frame.summary.slice(0, TOOL_LINE)}…` : frame.summary;
    const mark = el("span", { class: "mark", text: "⋯" });
    const details = el("details", {},
      el("summary", {}, mark, el("strong", { text: ` ${frame.name} ` }), el("span", { class: "summary", text: line })),
      el("div", { class: "label", text: "call" }), el("pre", { text: frame.summary }));
    this.turn(frame.turn_id).tools.set(frame.tool_use_id, { details, mark });
    this.message("tool", details).dataset.toolUseId = frame.tool_use_id;
  }

  toolResult(frame) {
    const tool = this.turn(frame.turn_id).tools.get(frame.tool_use_id);
    const result = [el("div", { class: "label", text: frame.is_error ? "error" : "result" }), el("pre", { text: frame.summary })];
    if (!tool) {
      this.message("tool", el("details", {}, el("summary", { text: frame.is_error ? "✗ a tool failed" : "✓ a tool's result" }), result));
      return;
    }
    tool.mark.textContent = frame.is_error ? "✗" : "✓";
    tool.details.closest(".msg").dataset.state = frame.is_error ? "error" : "done";
    tool.details.append(...result);
  }

  completed(frame) {
    const turn = this.turn(frame.turn_id);
    if (turn.stream) { turn.stream.dataset.state = "complete"; turn.stream = null; }
    const u = frame.usage || {};
    const parts = [`${frame.status} in ${(frame.duration_ms / 1000).toFixed(1)} s`];
    if (frame.cost_usd) parts.push(dollars(frame.cost_usd));
    if (u.input_tokens || u.output_tokens) parts.push(`${count(u.input_tokens)} in · ${count(u.output_tokens)} out tokens`);
    const item = this.add(el("li", { class: `turn-status ${frame.status}`, testid: "turn-status", dataset: { status: frame.status }, text: parts.join(" · ") }));
    item.dataset.turnId = frame.turn_id;
    this.turns.delete(frame.turn_id);
    if (this.running === frame.turn_id) this.setAgent("idle", null);
  }

  error(frame) {
    this.add(el("li", { class: "notice error", testid: "notice", dataset: { kind: "error", code: frame.code } },
      el("strong", { text: `${frame.code.replaceAll("_", " ")}: ` }), frame.message));
    if (frame.code === "queue_full" || frame.code === "shutting_down") {
      const newest = [...this.queued.values()].at(-1);
      if (newest) { newest.dataset.state = "refused"; newest.querySelector(".meta").textContent = "not accepted: send it again"; }
    }
  }
}
