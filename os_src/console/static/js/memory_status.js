// The memory daemon's health (its last batch, failing state, next retry, what it spent
// today and in all, what the curator said that was left out, turns waiting), what a
// person changed, and the exact boot prompt the next session starts with. Health keeps
// itself current while it is shown.

import { clear, count, dollars, el, newest, plural, relative, when } from "./dom.js";

// How often Health asks again while it is the section shown and the page is visible (each time once the last
// answer came): calm enough for a Sprite at work, soon enough to watch a batch, an import or a forget move.
const HEALTH_EVERY_MS = 5000;

function stat(label, value, testid) {
  return el("div", { class: "stat", testid }, el("div", { class: "label", text: label }), el("div", { class: "value", text: value }));
}

// A stat wide enough for a line under its value (none when sub is null).
function wideStat(label, value, sub, testid) {
  return el("div", { class: "stat wide", testid }, el("div", { class: "label", text: label }),
    el("div", { class: "value", text: value }), ...(sub === null ? [] : [el("div", { class: "sub", text: sub })]));
}

function spend(label, s) {
  return wideStat(label, dollars(s.cost_usd),
    `${plural(s.batches, "batch", "batches")}${s.failed_batches ? ` (${s.failed_batches} failed)` : ""} · ${count(s.input_tokens)} in · ${count(s.output_tokens)} out tokens`);
}

// What the curator's replies said that memory did not keep, in all: learnings past the bound of one call (the
// turns they came from count as curated all the same), lines it could not read, file rewrites not applied. Shown
// only when there is any (a server from before these counts sends none: nothing shown). The value names each
// count's unit: one sum of learnings, lines and rewrites ("15 in all") counted nothing a person could name.
function leftOut(s) {
  const was = (n) => (n === 1 ? "was" : "were");
  const counts = [];
  const said = [];
  if (s.learnings_over_bound) {
    counts.push(plural(s.learnings_over_bound, "learning"));
    said.push(`${plural(s.learnings_over_bound, "learning")} past what one call may keep ${was(s.learnings_over_bound)} left out`);
  }
  if (s.lines_ignored) {
    counts.push(plural(s.lines_ignored, "line"));
    said.push(`${plural(s.lines_ignored, "line")} that followed none of the reply format's rules ${was(s.lines_ignored)} ignored`);
  }
  if (s.files_rejected) {
    counts.push(plural(s.files_rejected, "file rewrite"));
    said.push(`${plural(s.files_rejected, "memory file rewrite")} ${was(s.files_rejected)} not applied (given twice, empty, cut off, too long, or of a file the curator may not write)`);
  }
  if (!said.length) return [];
  return [wideStat("What the curator said that memory left out", counts.join(", "), said.join(" · "), "memory-left-out")];
}

function duration(seconds) {
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// How far search has caught up: turns indexed by their words, embedded for meaning (newest first, in
// the background), and an import the server is applying.
function recall(r) {
  if (!r) return [];
  const searchable = r.turns - r.waiting_for_index;
  const out = [stat("Turns searchable", `${count(searchable)} of ${count(r.turns)}`, "memory-searchable")];
  if (r.embedded !== null) {
    const rate = r.waiting_for_vectors && r.per_second ? ` · ${r.per_second}/s, about ${duration(r.eta_s)} left` : "";
    out.push(wideStat("Found by meaning (embedded)", `${count(r.embedded)} of ${count(r.turns)}`,
      r.waiting_for_vectors ? `${count(r.waiting_for_vectors)} waiting, newest first${rate}` : "all embedded", "memory-embedding"));
  }
  if (r.importing !== null) out.push(stat("Importing", `${count(r.imported)} of ${count(r.importing)} turns`, "memory-importing"));
  // The server retries on its own; the person learns why an import waits (a full disk, say).
  if (r.import_failing) {
    out.push(wideStat("Import waiting: its last attempt failed", r.import_failing, null, "memory-import-failing"));
  }
  // A file the server gave up on is never retried: it waits for the operator.
  if (r.import_set_aside.length) {
    out.push(wideStat("Import given up after its attempts failed", r.import_set_aside.join(", "),
      "in .os/state/imports/: rename it back without .failed to retry, or remove it (`sprite-os memory status`)", "memory-import-set-aside"));
  }
  return out;
}

// Forgets not finished: their words are gone from everywhere but lines of the memory files, which the next
// session is not shown meanwhile. Stuck: kept a minute and more, or cut short by an error.
const KEPT_BECAUSE = {
  disk: "the disk would not rewrite a memory file",
  index: "the search index's rewrite without the forgotten words keeps failing",
  check: "the check of which lines came from the forgotten turns keeps failing",
  reader: "another program keeps memory open",
  error: "finishing it failed unexpectedly (the server's log says how)",
};

// Where a forget an error cut short is: the person finds its turns there, words and all, and forgets them again.
function cutShortIn(f) {
  const where = (f.cut_short_in ?? []).map((at) => `the session of ${when(at)}`).join(", ");
  return where ? ` (in ${where})` : "";
}

// What to forget again: the session when the forget cut short was of a whole session (Forget session), else turns.
function againToFinish(f) {
  const sessions = f.cut_short_sessions ?? 0; // 0 from a server that did not tell
  const one = f.cut_short === 1;
  const what = sessions === f.cut_short ? (one ? "the session" : "the sessions")
    : sessions ? "those sessions and turns" : one ? "the turn" : "the turns";
  return `forget ${what} again to finish ${one ? "it" : "them"}`;
}

function forgets(f) {
  if (!f || (!f.waiting && !f.cut_short)) return [];
  const why = f.cut_short
    ? `${plural(f.cut_short, "forget")} failed part way, the words still kept${cutShortIn(f)}: ${againToFinish(f)}`
    : f.stuck
      ? `waiting ${duration(f.kept_for_s)}: ${KEPT_BECAUSE[f.kept_why] ?? f.kept_why}; tried again on its own`
      : "their lines are being taken out of the memory files, and are left out of the next session meanwhile";
  const shown = wideStat(f.stuck ? "Forgetting is stuck" : "Forgets being finished", plural(f.waiting, "forget") + " waiting",
    why, "memory-forgets");
  if (f.stuck) shown.classList.add("state", "failing"); // in red, as the daemon's failing state
  return [shown];
}

// A backup of memory the forget's pass could not read (damaged, or no database at all): it may still hold the
// words of a turn forgotten since, and nothing the Sprite does will take them out. Only the operator can remove
// it; memory is degraded until then. One stat a backup, only while there is any (none from an older server).
function unreadableBackups(f) {
  return (f?.unreadable_backups ?? []).map((path) => {
    const shown = wideStat("A memory backup could not be read", `.os/${path}`,
      "Forgetting could not take the forgotten words out of this backup, so it may still hold them. Whoever runs "
      + "this Sprite should remove the file (`sprite-os memory status` names it too); memory is degraded until it is gone.",
      "memory-forget-unreadable");
    shown.classList.add("state", "failing");
    return shown;
  });
}

// The agent's own calls today against its daily cap (the relay refuses them past it).
function agentSpend(a) {
  const refused = Object.entries(a.refused_today).map(([why, n]) => `${n} ${why}`).join(", ");
  return wideStat("Agent spent today (UTC)", `${dollars(a.spent_today_usd)} of ${dollars(a.daily_usd)}`,
    `${plural(a.calls_today, "model call")}${refused ? ` · refused: ${refused}` : ""} · starts again ${when(a.resets_at)}`, "agent-spend");
}

/** Puts `nodes` in `box` in place of what it shows, keeping each node drawn the same (isEqualNode): a refresh
 * that moved one number replaces that stat alone, so a text selection, the scroll and a screen reader's place
 * stay, and nothing is drawn again when nothing moved. When a node comes or goes (the forgets' stat, the agent's
 * spend), all are replaced: matched by position, they would not line up. */
function redraw(box, nodes) {
  if (box.children.length !== nodes.length) {
    box.replaceChildren(...nodes);
    return;
  }
  nodes.forEach((node, i) => { if (!box.children[i].isEqualNode(node)) box.children[i].replaceWith(node); });
}

/** The memory daemon's health and the changes people made. Shown, it asks again every HEALTH_EVERY_MS, the next
 * once the last is answered; none while the page is hidden (one at once when it is visible again), none once
 * the person left the section or signed out (showing it again loads it, and starts again). A refresh that
 * fails keeps the numbers and says from when they are, in a note of its own: the one part of the panel a
 * screen reader is told of (`role="status"`), where the numbers are not (they would be read at every refresh). */
export class HealthPanel {
  constructor(root, connection) {
    this.root = root;
    this.conn = connection;
    this.stale = el("p", { class: "hint stale", testid: "memory-health-stale", role: "status" });
    this.body = el("div", { class: "stats", testid: "memory-health" });
    this.audit = el("ul", { class: "audit", testid: "memory-audit" });
    root.append(this.stale, this.body, el("h3", { text: "Changes a person made" }), this.audit);
    this.loads = newest(); // the panel's loads and refreshes alike: only the newest draws, and asks for the next
    this.timer = null;
    this.dueWhileHidden = false; // a refresh came due while the page was hidden: asked once it is visible again
    this.drawnAt = null;
    document.addEventListener("visibilitychange", () => {
      if (this.dueWhileHidden && document.visibilityState === "visible") this.refresh();
    });
  }

  signOut() {
    this.loads.forget(); // an answer on its way draws nothing, nor asks for the next
    clearTimeout(this.timer);
    this.dueWhileHidden = false;
    this.drawnAt = null;
    this.stale.textContent = "";
    clear(this.body);
    clear(this.audit);
  }

  /** `current()`: this is still the newest load of the section (MemoryView.show). A failure goes on to the
   * view, which says it; the refreshes go on after it either way. */
  async load(current = () => true) {
    const mine = this.loads.begin();
    try {
      await this.draw(() => current() && mine());
    } finally {
      if (mine()) this.next();
    }
  }

  next() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), HEALTH_EVERY_MS);
  }

  async refresh() {
    this.timer = null;
    this.dueWhileHidden = false;
    if (this.root.closest("[hidden]")) return; // another section or tab, or signed out: until Health is shown again
    if (document.visibilityState === "hidden") {
      this.dueWhileHidden = true;
      return;
    }
    const mine = this.loads.begin();
    try {
      await this.draw(mine);
    } catch {
      // The server away, or the request refused: the numbers stay, dated, and the next refresh tries again.
      if (mine() && this.drawnAt) this.note(`Could not refresh: these numbers are from ${this.drawnAt.toTimeString().slice(0, 8)}; trying again.`);
    }
    if (mine()) this.next();
  }

  /** Says `text` in the stale note, only if it says something else now: a live region written again with the
   * same words is read out again, at every failed refresh while the Sprite is away. */
  note(text) {
    if (this.stale.textContent !== text) this.stale.textContent = text;
  }

  async draw(current) {
    const [{ health: h }, { entries }] = await Promise.all([
      this.conn.request("memory_health"), this.conn.request("memory_audit", { limit: 20 })]);
    if (!current()) return;
    this.drawnAt = new Date();
    this.note("");
    const state = h.running ? "curating now" : h.failing ? "failing" : h.consecutive_failures ? "retrying" : "healthy";
    const o = h.observations;
    const b = h.last_batch;
    redraw(this.body, [
      el("div", { class: `stat state ${state.replace(" ", "-")}`, testid: "memory-state" },
        el("div", { class: "label", text: "Memory daemon" }), el("div", { class: "value", text: state }),
        el("div", { class: "sub", text: h.last_error ? `last error: ${h.last_error}` : `last success ${when(h.last_success_at)}` })),
      stat("Failures in a row", String(h.consecutive_failures)),
      stat("Next retry", h.next_retry_at ? relative(h.next_retry_at) : "none waiting"),
      stat("Turns waiting to be curated", count(o.pending ?? 0), "memory-pending"),
      wideStat("Last batch", b ? `#${b.id} ${b.status}` : "none yet",
        b ? `${when(b.created_at)} · ${b.trigger} · ${plural(b.turns, "turn")} · ${plural(b.learnings_added, "new learning")} · ${dollars(b.cost_usd)}${b.error ? ` · ${b.error}` : ""}` : "", "memory-last-batch"),
      spend("Spent today (UTC)", h.today), spend("Spent in all", h.total),
      ...leftOut(h.total),
      ...(h.agent ? [agentSpend(h.agent)] : []),
      stat("Turns recorded", `${count(o.total ?? 0)} (${count(o.processed ?? 0)} curated, ${count(o.stale ?? 0)} stale)`, "memory-turns"),
      stat("Learnings", `${count(h.learnings)} (${count(h.forgotten)} forgotten)`),
      stat("Pending actions", count(h.pending_actions)),
      ...forgets(h.forgets),
      ...unreadableBackups(h.forgets),
      ...recall(h.recall)]);
    redraw(this.audit, entries.length ? entries.map((e) => el("li", {},
      el("strong", { text: e.action }), ` ${when(e.at)} · `, e.file ? `${e.file}: ` : `learning #${e.learning_id}: `, e.detail))
      : [el("li", { class: "empty", text: "No edits, rollbacks or forgettings yet." })]);
  }
}

export class BootPromptPanel {
  constructor(root, connection) {
    this.conn = connection;
    this.facts = el("p", { class: "facts", testid: "boot-prompt-size" });
    this.text = el("pre", { class: "boot-prompt", testid: "boot-prompt", tabindex: "0", "aria-label": "The boot prompt" });
    root.append(el("p", { class: "hint", text: "Exactly the system prompt the next session will boot with: the deploy's files, then the curated memory, pending actions and the last 48 hours of learnings." }),
      this.facts, this.text);
  }

  signOut() {
    this.facts.textContent = this.text.textContent = "";
  }

  async load(current = () => true) {
    const answer = await this.conn.request("memory_boot_prompt");
    if (!current()) return;
    this.facts.textContent = `${count(answer.chars)} characters, about ${count(answer.tokens_estimate)} tokens (estimated as ${answer.estimate}).`;
    this.text.textContent = answer.text;
  }
}
