// Past sessions: every session that had a turn, newest first (its date, first line, the memory
// curator's summary, its turns and cost), each opened read-only from what Sprite OS recorded.

import { askingOnce, clear, dollars, el, plural, when } from "./dom.js";
import { FORGET_TIMEOUT, buryTurns, forgetControl, pastTurnItems } from "./turns.js";

const PAGE = 20;

export class PastSessions {
  /** `root` holds the panel; `toggle` is the button that opens it; `onClose` gives the conversation back. */
  constructor(root, toggle, connection, onClose) {
    Object.assign(this, { root, toggle, conn: connection, onClose });
    this.open = false;
    toggle.addEventListener("click", () => (this.open ? this.close() : this.show()));
    root.addEventListener("keydown", (event) => { if (event.key === "Escape") this.close(); });
  }

  async show() {
    this.open = true;
    this.toggle.setAttribute("aria-expanded", "true");
    this.root.hidden = false;
    this.list = el("ul", { class: "session-list", testid: "session-list", tabindex: "-1" });
    this.more = el("div", { class: "more" });
    const heading = el("h2", { id: "past-heading", tabindex: "-1", text: "Past sessions" });
    clear(this.root).append(
      el("header", { class: "past-head" }, heading,
        el("button", { type: "button", testid: "past-close", text: "Back to the conversation", onclick: () => this.close() })),
      el("p", { class: "hint", text: "Every session that had a turn, newest first, as Sprite OS recorded it. Open one to read it." }),
      this.list, this.more);
    heading.focus();
    await this.page(null);
  }

  close() {
    if (!this.open) return;
    this.open = false;
    this.toggle.setAttribute("aria-expanded", "false");
    this.root.hidden = true;
    clear(this.root);
    this.onClose();
    this.toggle.focus();
  }

  /** A page of sessions, older than `before`, into the list that asked (the panel shown again meanwhile
   * has a list of its own, which would take it twice); false if it could not be loaded, else where the
   * focus goes from the button that asked (`askingOnce`): the first session it shows, or the list. */
  async page(before) {
    const { list, more } = this;
    let answer;
    try {
      answer = await this.conn.request("sessions", before ? { before, limit: PAGE } : { limit: PAGE });
    } catch (error) {
      list.append(el("li", { class: "empty" }, el("span", { role: "alert", text: error.message })));
      return false;
    }
    if (list !== this.list) return true; // the panel was shown again: its own list asks for itself
    const items = answer.sessions.map((s) => this.item(s));
    list.append(...items);
    if (!answer.sessions.length && !before) list.append(el("li", { class: "empty", text: "No session has had a turn yet." }));
    clear(more);
    if (answer.more) {
      more.append(el("button", { type: "button", testid: "sessions-more", text: "Show older sessions",
        onclick: askingOnce(() => this.page(answer.sessions.at(-1).id)) }));
    }
    return items[0]?.querySelector("button") ?? list;
  }

  item(s) {
    const facts = [when(s.started_at), plural(s.turns, "turn")];
    if (s.cost_usd) facts.push(dollars(s.cost_usd));
    if (s.current) facts.push("this session");
    return el("li", { testid: "past-session", dataset: { sessionId: s.id, current: String(s.current) } },
      el("button", { type: "button", class: "session-open", onclick: () => this.read(s) },
        el("span", { class: "when", text: facts.join(" · ") }),
        el("span", { class: "first", dir: "auto", text: s.first_line || "(no words)" }),
        s.summary ? el("span", { class: "summary", dir: "auto", text: s.summary }) : null));
  }

  /** Turns forgotten anywhere: tombstones here too, if their session is open. */
  handle(frame) {
    if (frame.type === "turns_forgotten" && this.turns?.isConnected) buryTurns(this.turns, frame);
  }

  async forget(which, done) {
    try {
      const answer = await this.conn.request("forget_turns", which, { timeout: FORGET_TIMEOUT });
      done.textContent = `Forgotten: ${answer.forgotten} turn${answer.forgotten === 1 ? "" : "s"}, and ${answer.learnings} learning${answer.learnings === 1 ? "" : "s"} that came from them.`;
      return true;
    } catch (error) {
      done.textContent = `Not forgotten: ${error.message}`;
      return false;
    }
  }

  /** One session, read-only, a page of turns at a time (earlier pages on demand); false if a page could
   * not be loaded, else where the focus goes from the button that asked (`askingOnce`): the next page's
   * button, or the list of turns. */
  async read(s, before = null, turns = null) {
    if (!turns) {
      turns = el("ol", { class: "messages read-only", testid: "past-turns", tabindex: "-1", "aria-label": `Session of ${when(s.started_at)}` });
      this.turns = turns;
      const heading = el("h2", { tabindex: "-1", text: `Session of ${when(s.started_at)}` });
      const said = el("p", { class: "hint", role: "status", testid: "past-status" });
      clear(this.root).append(
        el("header", { class: "past-head" }, heading,
          el("button", { type: "button", testid: "past-back", text: "All past sessions", onclick: () => this.show() }),
          el("button", { type: "button", testid: "past-close", text: "Back to the conversation", onclick: () => this.close() })),
        el("p", { class: "hint", dir: "auto", text: s.summary ? `Read only. ${s.summary}` : "Read only: what was said, as Sprite OS recorded it." }),
        el("p", { class: "session-forget" }, forgetControl("this whole session", () => this.forget({ session_id: s.id }, said))),
        said, turns);
      heading.focus();
    }
    let page;
    try {
      page = await this.conn.request("session_turns", { session_id: s.id, limit: PAGE, ...(before ? { before } : {}) });
    } catch (error) {
      turns.append(el("li", { class: "notice error" }, el("span", { role: "alert", text: error.message })));
      return false;
    }
    turns.querySelector(":scope > .load-earlier")?.remove();
    const said = this.root.querySelector("[data-testid=past-status]");
    const items = page.turns.flatMap((t) => pastTurnItems(t, { forget: (which) => this.forget(which, said), session: s.id }));
    const earlier = page.more ? el("button", { type: "button", testid: "load-earlier",
      text: "Show earlier turns", onclick: askingOnce(() => this.read(s, page.turns[0].turn, turns)) }) : null;
    if (earlier) items.unshift(el("li", { class: "load-earlier" }, earlier));
    turns.prepend(...items);
    return earlier ?? turns;
  }
}
