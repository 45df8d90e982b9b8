// What the curator learned: search with type, date, confidence and source; the turn a
// learning came from, read from the transcript; forget, and undo a forgetting.

import { append, clear, day, el, keepingFocus, plural, when } from "./dom.js";
import { FORGET_TIMEOUT, forgetControl } from "./turns.js";

/** The control that answers another: after Forget the focus is on Undo, and back. */
const ANSWER = { "learning-forget": "learning-undo", "learning-undo": "learning-forget" };

const TYPES = ["FACT", "PREFERENCE", "CORRECTION", "PATTERN", "ACTION", "TOOL_INSTALL", "SUMMARY", "EPISODE"];

export class LearningsPanel {
  constructor(root, connection, flash, reload) {
    this.conn = connection;
    this.flash = flash;
    // Its Search, type and forgotten filters load the section as MemoryView's Refresh does, under the
    // section's one count of loads: the newest, whichever started it, is the one drawn and `data-loading`.
    this.reload = reload;
    this.query = el("input", { type: "search", testid: "learning-search", placeholder: "Search what the Sprite learned", "aria-label": "Search learnings" });
    this.type = el("select", { testid: "learning-type", "aria-label": "Type" },
      el("option", { value: "", text: "All types" }), TYPES.map((t) => el("option", { value: t, text: t })));
    this.forgotten = el("input", { type: "checkbox", testid: "learning-forgotten", id: "learning-forgotten" });
    this.results = el("ol", { class: "learnings", testid: "learnings", "aria-label": "Learnings" });
    this.turnsHeading = el("h3", { text: "From past turns", hidden: true });
    this.episodes = el("ol", { class: "learnings", testid: "episodes", "aria-label": "Past turns", hidden: true });
    this.summary = el("p", { class: "hint" });
    const form = el("form", { class: "search-form", onsubmit: (e) => { e.preventDefault(); this.reload(); } },
      this.query, this.type, el("label", { class: "check", for: "learning-forgotten" }, this.forgotten, " forgotten"),
      el("button", { type: "submit", class: "primary", testid: "learning-search-button", text: "Search" }));
    this.type.addEventListener("change", () => this.reload());
    this.forgotten.addEventListener("change", () => this.reload());
    root.append(form, this.summary, this.results, this.turnsHeading, this.episodes);
    this.drawn = new Map(); // "kind:id" -> {node, hit}: what each item shows, to keep it through a reload
  }

  /** The search the form holds, drawn while `current()` (MemoryView.load). */
  async load(current) {
    const query = this.query.value.trim();
    const fields = { query, forgotten: this.forgotten.checked, limit: 50 };
    if (this.type.value) fields.types = [this.type.value];
    const { hits } = await this.conn.request("memory_search", fields); // a failure: said if still current()
    if (!current()) return; // a newer load was sent meanwhile: its answer is the one to show
    const before = this.drawn;
    this.drawn = new Map();
    const learned = hits.filter((h) => h.kind !== "episode");
    const turns = hits.filter((h) => h.kind === "episode");
    this.summary.textContent = this.forgotten.checked ? `${hits.length} forgotten, newest forgetting first.`
      : query ? `${plural(learned.length, "learning")} found for “${query}”, best first${turns.length ? `, and ${plural(turns.length, "past turn")}` : ""}.`
        : `The ${hits.length} newest.`;
    keepingFocus(this.results, () => {
      clear(this.results).append(...learned.map((hit) => this.item(hit, before)));
      if (!learned.length) this.results.append(el("li", { class: "empty", text: turns.length ? "No learning matches; past turns do:" : "Nothing here." }));
    });
    keepingFocus(this.episodes, () => clear(this.episodes).append(...turns.map((hit) => this.item(hit, before))));
    this.episodes.hidden = this.turnsHeading.hidden = !turns.length;
  }

  /** Sign out: the search the person typed and what it found leave the page; a search still on its
   * way shows nothing. */
  signOut() {
    this.query.value = this.type.value = "";
    this.forgotten.checked = false;
    this.drawn = new Map();
    this.summary.textContent = "";
    clear(this.results);
    clear(this.episodes);
    this.episodes.hidden = this.turnsHeading.hidden = true;
  }

  /** The item of `hit`: the one drawn before if it shows the same (the person's opened turn and a
   * forget they were asked to confirm stay as they left them), or a new one. */
  item(hit, before = new Map()) {
    const was = before.get(drawnKey(hit));
    if (was && JSON.stringify(was.hit) === JSON.stringify(hit)) {
      this.drawn.set(drawnKey(hit), was);
      return was.node;
    }
    const node = el("li", { class: "learning", testid: "learning", dataset: { id: hit.id, type: hit.type } });
    this.fill(node, hit);
    return node;
  }

  fill(node, hit) {
    this.drawn.set(drawnKey(hit), { node, hit });
    node.dataset.forgotten = hit.forgotten_at ? "true" : "false";
    const episode = hit.kind === "episode";  // a raw turn search found: nothing to forget, it is the record
    const facts = episode ? [day(hit.created_at)] : [day(hit.created_at), `confidence ${hit.confidence.toFixed(2)}`];
    if (hit.score !== null) facts.push(`score ${hit.score.toPrecision(2)}`);
    const source = hit.turn
      ? el("button", { type: "button", class: "link", testid: "learning-source", onclick: () => this.openTurn(node, hit.turn.observation_id),
        text: `${episode ? "turn" : "from turn"} ${hit.turn.sequence_num} of session ${hit.turn.session_id} on ${day(hit.turn.timestamp)}` })
      : el("span", { class: "muted", text: hit.session_id ? `from session ${hit.session_id} (no turn cited)` : "no source recorded" });
    const action = episode ? [] : hit.forgotten_at
      ? [el("span", { class: "forgotten", text: `Forgotten ${when(hit.forgotten_at)}` }),
        el("button", { type: "button", testid: "learning-undo", text: "Undo", onclick: () => this.setForgotten(node, hit, false) })]
      : [el("button", { type: "button", testid: "learning-forget", text: "Forget", title: "Leaves search and the boot prompt; the transcript keeps the turn", onclick: () => this.setForgotten(node, hit, true) })];
    // A forgotten learning still has the turn it came from in the transcript: offer to forget that too.
    const offer = hit.forgotten_at && hit.turn ? el("div", { class: "offer", testid: "learning-offer" },
      "The turn it came from is still in the transcript. ",
      forgetControl(`turn ${hit.turn.sequence_num} of session ${hit.turn.session_id}`, () => this.forgetTurn(node, hit))) : null;
    // Drawn again under the keyboard (Forget pressed): the focus moves to its answer (Undo), not <body>.
    keepingFocus(node, () => append(clear(node), [
      el("div", { class: "line" }, el("span", { class: `badge type-${hit.type.toLowerCase()}`, text: hit.type }),
        el("span", { class: "content", testid: "learning-content", dir: "auto", text: hit.content })),
      el("div", { class: "meta" }, facts.join(" · "), " · ", source, el("span", { class: "actions" }, action)),
      offer, el("div", { class: "turn-view" })]), { next: ANSWER, fallback: "button" });
  }

  async setForgotten(node, hit, forget) {
    try {
      const { learning } = await this.conn.request(forget ? "memory_forget" : "memory_unforget", { learning_id: hit.id });
      this.fill(node, { ...hit, forgotten_at: learning.forgotten_at });
      this.flash(forget ? "Forgotten: it leaves search and the next boot prompt. Undo brings it back." : "Remembered again.");
    } catch (error) {
      this.flash(error.message, "error");
    }
  }

  async forgetTurn(node, hit) {
    try {
      const done = await this.conn.request("forget_turns", { observation_ids: [hit.turn.observation_id] }, { timeout: FORGET_TIMEOUT });
      node.querySelector(".offer")?.remove();
      this.flash(`Forgotten for good: the turn, and ${done.learnings} learning${done.learnings === 1 ? "" : "s"} that came from it.`);
      await this.reload();
      return true;
    } catch (error) {
      this.flash(error.message, "error");
      return false;
    }
  }

  async openTurn(node, observationId) {
    const view = node.querySelector(".turn-view");
    if (view.childElementCount) { clear(view); return; }
    try {
      const { turn } = await this.conn.request("memory_turn", { observation_id: observationId });
      view.append(el("div", { class: "turn", testid: "turn" },
        el("div", { class: "who", text: `Turn ${turn.sequence_num} of session ${turn.session_id}, ${when(turn.timestamp)} (${turn.processed})` }),
        el("div", { class: "said" }, el("strong", { text: "They said: " }), el("span", { dir: "auto", text: turn.user_message })),
        turn.tool_calls.map((c) => el("details", { class: "tool" },
          el("summary", { text: `${c.is_error ? "✗" : "✓"} ${c.name}` }), el("pre", { dir: "auto", tabindex: "0", text: c.input }), el("pre", { dir: "auto", tabindex: "0", text: c.output }))),
        el("div", { class: "said" }, el("strong", { text: "The agent answered: " }), el("span", { dir: "auto", text: turn.agent_response }))));
    } catch (error) {
      this.flash(error.message, "error");
    }
  }
}

const drawnKey = (hit) => `${hit.kind}:${hit.id}`;
