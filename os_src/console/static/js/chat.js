// The conversation: what Sprite OS recorded of the current session (asked for on every fresh
// `ready`, so a reload or a second device shows the same), then the live events: messages as
// they stream, tool calls folded to one line, each turn's status and cost, one retry line per
// turn that updates in place, failures with a Retry, and notices (sessions, reconnections).
// The person's messages not yet answered are shown here; what keeps and settles them is
// kept_messages.js.

import { askingOnce, clear, dollars, el, newest, size } from "./dom.js";
import { SAID, afterRestart, browserId, held, inRecord, keep, makeBrowserId, noteSent, readKept, refusal, sendingBrowserId, sentFrom, sentHere, shownIn, standing, turnsSince, unseenSince, unsentFor } from "./kept_messages.js";
import { sessionStore } from "./storage.js";
import { FORGET_TIMEOUT, answerBody, buryTurns, failureItem, forgetControl, messageItem, pastTurnItems, proxyTrouble, statusItem, toolItem, userText } from "./turns.js";

const DRAFT_KEY = "sprite-os.draft";
// Events after which no streamed word is missing, whatever went by unseen before them (`handle`).
const WHOLE = new Set(["ready", "turn_started", "assistant_message", "turn_complete"]);
// A turn's events that come after a message of it is whole (a tool is called once the text before it is).
const ENDED = new Set(["assistant_message", "tool_use", "tool_result"]);
const STICK = 48; // px from the bottom that still counts as "at the latest"
const PAGE = 30; // turns asked for at a time
// The most characters a message may have (the protocol's MAX_USER_TEXT): a longer one is never sent.
const MAX_TEXT = 100_000;

export class ChatView {
  constructor({ list, form, composer, send, interrupt, newSession, agentState, jump, sessionCost }, connection) {
    Object.assign(this, { list, form, composer, sendButton: send, interruptButton: interrupt, agentState, jump, sessionCost });
    this.conn = connection;
    this.request = (type, fields) => connection.request(type, fields); // the record's pages (kept_messages.js)
    this.announcer = el("div", { class: "visually-hidden", role: "status", testid: "announcer" });
    list.after(this.announcer);
    this.queued = new Map(); // client_id -> the message's element, until its turn starts
    this.takenItems = new Map(); // client_id -> a message answered already_taken whose turn is not shown yet
    this.unsentItems = new Set(); // messages shown unsent with a Send again: kept through every redraw until sent
    this.turns = new Map(); // turn_id -> {stream, tools, retry}
    this.texts = new Map(); // turn_id -> the person's message (a failed turn's Retry), until the turn ends
    this.shown = new Set(); // turn_ids whose message is in the view (live or from the record)
    this.sent = 0;
    // In the client ids this page makes (`browserId()`, read at each use): the browser's other tabs know them.
    // Settled once the browser has one (or cannot keep one): what waits on the id, a test say, awaits it.
    this.browserReady = makeBrowserId();
    this.running = null; // the running turn's id
    this.stream = null; // the server run the view is current with (ready.stream)
    this.session = null; // the session the agent is in, as last heard (ready, session_started)
    this.history = null; // {session, first: the earliest turn number shown, more, button}
    this.stick = true; // follow the conversation as it grows, unless the person scrolled up
    this.unseen = false; // events went by unseen since the answer's last words (`handle`)
    this.joined = null; // the turn running when the view was last rebuilt: its first words were written before
    this.restored = new Map(); // client_id -> {entry, item}: kept through a reload, shown, settled at the first `ready`
    this.asks = false; // the server says it knows the commands an earlier run took (ready.knows_commands): `ask` may send one
    // Fresh snapshots handled (each rebuilds the list): only the latest one's checks say they are settled
    // (`checked`), and a page of the record asked before one is not the new list's (`loadHistory`).
    // `snapshot()`: the list is still the one the latest snapshot built.
    this.snapshots = newest();
    this.snapshot = this.snapshots.begin();
    form.addEventListener("submit", (event) => { event.preventDefault(); this.submit(); });
    composer.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); this.submit(); }
    });
    composer.value = sessionStore.get(DRAFT_KEY) || ""; // a draft survives a reload
    composer.addEventListener("input", () => this.keepDraft());
    interrupt.addEventListener("click", () => this.command({ type: "interrupt" }));
    newSession.addEventListener("click", () => this.command({ type: "new_session" }));
    list.addEventListener("scroll", () => {
      this.stick = list.scrollHeight - list.scrollTop - list.clientHeight < STICK;
      if (this.stick) this.jump.hidden = true;
    });
    jump.addEventListener("click", () => { this.toLatest(); this.composer.focus(); });
    this.showKept(readKept());
  }

  /** The messages a reload left unsettled, shown at once, before the socket is back (a Sprite away can
   * be long in coming): each one a refusal or a check said unsent is so again, with its Send again; the
   * rest wait for the connection, and the first `ready` settles them (`restore`). */
  showKept(entries) {
    const unsent = [];
    for (const entry of entries) {
      const item = this.add(this.pendingItem(entry));
      if (unsentFor(entry)) unsent.push([item, entry]);
      else {
        item.dataset.state = "kept";
        this.meta(item).textContent = SAID.connecting;
        this.restored.set(entry.id, { entry, item });
      }
    }
    for (const [item, entry] of unsent) this.unsent(item, entry.why || SAID.refused); // (each keeps them all)
  }

  keepDraft() {
    // A draft the storage cannot keep (full) is kept not at all: the one kept before would come back at a reload
    // with words the person has since taken out.
    if (!this.composer.value || !sessionStore.set(DRAFT_KEY, this.composer.value)) sessionStore.remove(DRAFT_KEY);
  }

  /** Sign out: the person's words leave the page as they leave the tab's storage (the draft, the
   * messages kept for a reload). A sign-in after it, in this page, starts from the record alone: what
   * the page still held is neither kept again nor shown as this tab's own. */
  signOut() {
    clear(this.list);
    for (const kept of [this.queued, this.takenItems, this.unsentItems, this.turns, this.texts, this.shown, this.restored]) kept.clear();
    Object.assign(this, { stream: null, session: null, history: null, replay: null, joined: null, unseen: false });
    this.sessionCost.textContent = "";
    this.composer.value = "";
    this.keepDraft();
    keep([]);
    noteSent(null);
    this.snapshots.forget(); // the checks still running were the person's who signed out
    delete this.list.dataset.checks;
    delete this.list.dataset.history; // the next sign-in's is still to load
    this.setAgent("idle", null);
  }

  /** Sends the composer's message, or `again` (a Send again, a Retry: the box is left as it is, even
   * when it holds the same words); false if it could not go. `id`: the message's own client id, on a
   * Send again: the server never runs a message twice by its id (`already_taken`), so a second click,
   * in this tab or a duplicate of it, does not give the agent the message again. A Retry is a new message. */
  submit(again = null, id = null) {
    const fromBox = again === null;
    const text = fromBox ? this.composer.value : again;
    if (!text.trim()) return false;
    const length = [...text].length; // characters as the server counts them (code points)
    if (length > MAX_TEXT) {
      this.notice(`This message is too long to send: ${length.toLocaleString("en-US")} characters, and the limit is ${
        MAX_TEXT.toLocaleString("en-US")}.${fromBox ? " It is still in the box: shorten it, or send it in parts." : ""}`, "error");
      return false;
    }
    // Unique across devices too: the record finds a message by it after a restart (`restarted`).
    const browser = sendingBrowserId();
    const clientId = id || `${browser ? `web.${browser}.` : "web-"}${Date.now().toString(36)}-${
      Math.random().toString(36).slice(2, 8)}-${++this.sent}`;
    if (!this.conn.send({ type: "user_message", text, client_id: clientId })) {
      this.notice(`Not connected: your message was not sent. ${fromBox ? "It is still in the box." : "Try again once connected."}`, "error");
      return false;
    }
    noteSent(clientId);
    if (fromBox) { this.composer.value = ""; this.keepDraft(); }
    const message = this.add(this.pendingItem({ id: clientId, text, stream: this.stream, session: this.session, link: this.conn.links }));
    this.queued.set(clientId, message);
    this.keepPending();
    this.toLatest(); // the person's own message: the view goes to it, and follows the reply from there
    return true;
  }

  /** The person's message, waiting for the agent; it knows the server run and session it went to, and
   * the socket it went on (`link`: 0 for one kept through a reload). */
  pendingItem({ id, text, stream, session, link = 0 }) {
    const item = messageItem("user", userText(text), SAID.waiting);
    Object.assign(item.dataset, { state: "queued", clientId: id, stream: stream ?? "", session: session ?? "", link: String(link) });
    return item;
  }

  /** Keeps the tab's unsettled messages (waiting, being checked, unsent) for a reload (kept_messages.js). */
  keepPending() {
    keep([...[...new Set([...this.queued.values(), ...this.unsentItems])].filter((item) => item.dataset.clientId).map(entryOf),
      ...[...this.restored.values()].map(({ entry }) => entry)]);
  }

  /** A message the record settled without a Send again: taken, or a command it cannot say of (its record unread). */
  settled(item, state, said) {
    this.unsentItems.delete(item);
    item.dataset.state = state;
    this.meta(item).textContent = said;
  }

  /** A command the record cannot show (it leaves no turn, kept_messages.js): sent again with its own
   * client id, which the server refuses `already_taken` when the agent took it (settled as taken:
   * `alreadyTaken`), or runs now, once, when it never did (its turn starts as this message's). Only a
   * server that says it knows the commands an earlier run took is asked (`asks`): one that does not (memory
   * off, its record unread at start, a version rolled back to from before it kept them) would run it again. */
  ask(item, said) {
    const { clientId } = item.dataset;
    if (!this.asks) { // a server that does not know the commands an earlier run took would run it again
      this.settled(item, "command", SAID.command);
      return;
    }
    if (!this.conn.send({ type: "user_message", text: item.querySelector(".text").textContent, client_id: clientId })) {
      this.unsent(item, SAID.unsure, true, true);
      return;
    }
    this.unsentItems.delete(item);
    Object.assign(item.dataset, { state: "queued", stream: this.stream ?? "", session: this.session ?? "", link: String(this.conn.links) });
    this.meta(item).textContent = said;
    this.queued.set(clientId, item);
    this.keepPending();
  }

  /** A message the agent never took: its words stay, said to be unsent, with a Send again (none when
   * sending it again cannot succeed: `again` false). */
  unsent(item, why, again = true, unsure = false) {
    const text = item.querySelector(".text").textContent;
    item.dataset.state = "refused";
    item.dataset.why = why;
    if (unsure) item.dataset.unsure = "true"; // (looked for again after a reload)
    else delete item.dataset.unsure;
    const meta = clear(this.meta(item));
    meta.append(why);
    if (again) {
      meta.append(" ", el("button", { type: "button", class: "link", testid: "send-again", text: "Send again",
        onclick: () => { if (this.submit(text, item.dataset.clientId)) { item.remove(); this.unsentItems.delete(item); this.keepPending(); } } }));
    }
    this.unsentItems.add(item);
    this.keepPending();
  }

  /** Messages still waiting when the server restarted: the record is asked whether the old server
   * took each (`afterRestart`) before a Send again is offered, so a click does not give the agent the
   * same message twice. */
  async restarted(items, left) {
    for (const item of items) {
      item.dataset.state = "checking";
      this.meta(item).textContent = SAID.restartChecking;
      this.unsentItems.add(item); // the person's words, kept through a redraw until settled
    }
    this.keepPending();
    const unseen = await unseenSince(this.request, left);
    const unmatched = [];
    for (const item of items.filter((mine) => mine.isConnected)) { // (not since Sign out)
      const { verdict, said, unsure } = afterRestart(entryOf(item), unseen);
      if (verdict === "unsent") unmatched.push([item, said, unsure]);
      else if (verdict === "ask") this.ask(item, said);
      else this.settled(item, verdict, said);
    }
    this.keepPending();
    for (const [item, said, unsure] of unmatched) this.unsent(item, said, true, unsure);
  }

  /** The line under a message, made if it has none. */
  meta(item) {
    return item.querySelector(".meta") ?? item.appendChild(el("div", { class: "meta" }));
  }

  command(frame) {
    if (!this.conn.send(frame)) this.notice("Not connected right now.", "error");
  }

  /** Said to screen readers (a live region of its own: the conversation itself is not read out as it streams). */
  announce(text) {
    this.announcer.textContent = text;
  }

  notice(text, kind = "info") {
    return this.add(el("li", { class: `notice ${kind}`, testid: "notice", dataset: { kind }, text }));
  }

  /** Appends to the conversation, following it if the person is at the latest. The person's messages
   * still waiting for their turn stay at the bottom: the running turn's tools, answer and status, and
   * anything else, go above the first of them, so the conversation reads in the order the agent took
   * them, as its record does (a second question sat above the first one's answer). */
  add(item) {
    const waiting = item.dataset.state === "queued" ? null : this.list.querySelector(':scope > [data-state="queued"]');
    this.list.insertBefore(item, waiting);
    this.grew();
    return item;
  }

  grew() {
    if (this.stick) this.list.scrollTop = this.list.scrollHeight;
    else this.jump.hidden = false;
  }

  toLatest() {
    this.stick = true;
    this.jump.hidden = true;
    this.list.scrollTop = this.list.scrollHeight;
  }

  setAgent(state, turnId) {
    this.running = state === "running" || state === "starting" ? turnId : null;
    this.agentState.textContent = this.running ? "working…" : state === "stopping" ? "stopping…" : "idle";
    this.agentState.dataset.state = this.running ? "running" : state;
    this.interruptButton.disabled = !this.running;
  }

  turn(turnId) {
    if (!this.turns.has(turnId)) this.turns.set(turnId, { stream: null, tools: new Map(), retry: null });
    return this.turns.get(turnId);
  }

  /** A frame from the Sprite; `skipped`: events went by unseen just before it (connection.js, by seq). */
  handle(frame, { skipped = false } = {}) {
    // The streamed words (text_delta) are the only events a resume does not replay: events skipped since the
    // answer's last words mean some of them went by while the page was away (`delta`), whichever events
    // (replayed) went by with them: another tab's upload, say. A whole message, a turn's start or end, or a
    // snapshot leaves none missing.
    if (skipped) this.unseen = true;
    if (WHOLE.has(frame.type)) this.unseen = false;
    // The running turn's message being written when the view was rebuilt, if one was, has ended: its next
    // words begin a message of their own, seen from its start (`delta`).
    if (ENDED.has(frame.type) && frame.turn_id === this.joined) this.joined = null;
    const result = this.apply(frame);
    if (this.replay && frame.type !== "ready") this.replaying(frame);
    if (frame.type === "ready" || frame.type === "turn_started" || frame.type === "error") this.keepPending();
    return result;
  }

  apply(frame) {
    switch (frame.type) {
      case "ready": return this.ready(frame);
      case "turn_started": return this.started(frame);
      case "text_delta": return this.delta(frame);
      case "assistant_message": return this.assistant(frame);
      case "tool_use": return this.toolUse(frame);
      case "tool_result": return this.toolResult(frame);
      case "turn_complete": return this.completed(frame);
      case "session_started": this.session = frame.session_id; return this.notice("A new session started: the agent remembers what memory kept.", "session");
      case "session_ended": return this.notice(`The session ended (${
        frame.reason === "forget" ? "a turn of it was forgotten" : frame.reason.replace("_", " ")}).`, "session");
      case "error": return this.error(frame);
      case "model_retry": return this.retrying(frame);
      case "turns_forgotten": return buryTurns(this.list, frame);
      case "file_uploaded": return this.notice(`${frame.path} was uploaded (${size(frame.size)}): the agent hears of it with the next message.`, "upload");
      default: return undefined;
    }
  }

  /** A fresh snapshot (a first connection, a reload, a server that restarted): the view is rebuilt
   * from the record; a resume keeps it, and the missed events follow. */
  ready(frame) {
    const fresh = frame.resync || frame.stream !== this.stream;
    // The running turn's message, shown with the snapshot: where it came from, as a turn started while the
    // page was open says it (`started`), unless it is this tab's own (asked before the list is rebuilt).
    const runningFrom = this.from(frame.turn_client_id);
    this.replay = null; // a replay this socket's ready cut short is not counted on
    const before = this.stream;
    this.stream = frame.stream;
    this.asks = Boolean(frame.knows_commands); // (a server from before it did, or with memory off: never)
    const session = this.session;
    this.session = frame.session_id;
    if (fresh) {
      // A server that restarted dropped the messages still waiting for the agent: they stay in view,
      // and the session's record says which it took after all (`restarted`). Not those sent on this
      // socket, after its hello: the server that sent this `ready` reads them after the snapshot.
      const dropped = before !== null && before !== frame.stream ? [...this.queued.values()].filter((item) => this.earlier(item)) : [];
      const left = { session, shown: new Set(this.shown) }; // the session the old server ran
      // Left unsent before: still the person's words, still unsent; but the running turn's (a Send again
      // from a duplicate of this tab, say) is that turn, shown as it.
      const running = [...this.unsentItems].filter((item) => item.dataset.clientId === frame.turn_client_id);
      for (const item of running) this.unsentItems.delete(item);
      const unsent = [...this.unsentItems];
      // The same server after a long gap: the messages it still holds for the agent stay in view as
      // waiting, and so do those sent on this socket, after its hello, whatever came before (the page's
      // first `ready`, a restart): it reads them after the snapshot...
      const holds = held(frame);
      const ours = [...this.queued].filter(([id]) => id !== frame.turn_client_id);
      const same = before === frame.stream || before === null ? ours : []; // no restart in between
      const still = ours.filter(([id, item]) => !this.earlier(item) || (same === ours && holds.has(id)));
      // ...and those it no longer holds either started (the record shows them) or never reached it (sent
      // on a link that had died): looked for in the record by client id, as after a reload (`settleStarted`).
      const unheard = same.filter(([id, item]) => !holds.has(id) && this.earlier(item)).map(([, item]) => item);
      clear(this.list);
      this.turns.clear();
      this.texts.clear();
      this.shown.clear();
      this.queued.clear();
      this.takenItems.clear();
      this.history = null;
      this.snapshot = this.snapshots.begin();
      delete this.list.dataset.history; // the new snapshot's is still to load
      this.sessionCost.textContent = "";
      if (before !== null) {
        this.notice(before !== frame.stream
          ? "Reconnected. The server restarted meanwhile, and a new session began: the one before is in Past sessions. The canvas is current."
          : "Reconnected after a long gap: the conversation above is what the Sprite recorded.", "reconnected");
      }
      if (frame.turn_id && frame.turn_text) this.startedItem(frame.turn_id, frame.turn_text, runningFrom);
      this.joined = frame.turn_id ?? null;
      for (const item of unsent) this.add(item);
      for (const [id, item] of still) { // held by this server run (one sent before the page's first
        // `ready` went with none): kept for a reload as its, so a reload does not take it for dropped
        Object.assign(item.dataset, { stream: frame.stream, session: frame.session_id ?? "" });
        this.queued.set(id, this.add(item));
      }
      const checks = dropped.length ? [this.restarted(dropped.map((item) => this.add(item)), left)] : [];
      const unsure = this.checking([...unheard.map((item) => this.add(item)), ...this.restore(frame)]);
      const history = this.loadHistory(null);
      checks.push(unsure.length ? history.then((turns) => this.settleStarted(unsure, turns)) : history);
      this.checked(checks);
    } else {
      // A resume: the events since the page's last follow this frame, and `ready` is the state once
      // they are applied. A message sent on an earlier socket that the server neither holds nor runs
      // has started in those events, or never reached it (its frame was lost with the dead link).
      // The server snapshots `ready` and queues the replay with nothing read in between, so a message
      // it took before the snapshot is in `waiting`, is the running turn, or starts in the replay.
      const holds = held(frame);
      const unheard = [...this.queued].filter(([id, item]) => !holds.has(id) && this.earlier(item)).map(([, item]) => item);
      if (unheard.length) {
        this.replay = { left: frame.replayed, last: frame.last_seq, items: this.checking(unheard) };
        if (!frame.replayed) this.replaying(null);
      }
    }
    this.setAgent(frame.agent, frame.turn_id);
  }

  /** Says on the list (`data-checks`: "running", then "settled") when what a fresh snapshot set going
   * has answered: the record's history, the restart check, the looks for messages the server no longer
   * holds. Only the latest snapshot's say "settled". What a test (or a person's tool) can wait on. */
  checked(checks) {
    const current = this.snapshot;
    this.list.dataset.checks = "running";
    Promise.allSettled(checks).then(() => { if (current()) this.list.dataset.checks = "settled"; });
  }

  /** Sent on a socket before the one now open (whose `ready` is being handled). */
  earlier(item) {
    return Number(item.dataset.link) < this.conn.links;
  }

  /** Messages the page does not know the server has: said to be looked for until settled (`settleStarted`). */
  checking(items) {
    for (const item of items) {
      this.queued.delete(item.dataset.clientId);
      item.dataset.state = "checking";
      this.meta(item).textContent = SAID.checking;
      this.unsentItems.add(item);
    }
    return items;
  }

  /** Counts a resume's replayed events; once the last is in (or a live event came), the messages of
   * the page's that none of them started never reached the server: not sent, with a Send again. */
  replaying(frame) {
    const replay = this.replay;
    if (frame) replay.left -= 1;
    if (replay.left > 0 && !(frame && frame.seq > replay.last)) return;
    this.replay = null;
    this.settleStarted(replay.items, [], true);
  }

  /** After a reload, the tab's messages it had not seen settled (shown since the page loaded:
   * `showKept`), settled as the live page does: one the server still holds waits for its turn
   * (`ready.waiting`), one that is the running turn is that turn, and one sent to a server run that has
   * since stopped is looked for in the record (`restarted`). One the same server no longer holds has
   * started (its turn is in the record) or was refused while the page reloaded: returned, to be looked
   * for in the history. */
  restore(frame) {
    const unsure = [];
    const dropped = new Map(); // the session each was sent in -> its items
    for (const [id, { entry, item }] of this.restored) {
      const where = standing(entry, frame);
      if (where === "running" || this.queued.has(id)) { item.remove(); continue; } // the running turn, shown as it
      this.add(item);
      if (where === "restarted") {
        if (!dropped.has(entry.session)) dropped.set(entry.session, []);
        dropped.get(entry.session).push(item);
      } else if (where === "waiting") {
        item.dataset.state = "queued";
        this.meta(item).textContent = SAID.waiting;
        this.queued.set(id, item);
      } else unsure.push(item);
    }
    this.restored.clear();
    for (const [session, items] of dropped) this.restarted(items, { session: session || null, shown: new Set() });
    return unsure;
  }

  /** Those of `items` whose turn the history shows are settled (the history shows them); one sent in a
   * session that has ended since (a New session, a crash, the idle timeout while the page was away) is
   * looked for in that session's record and those after it; one whose turn started meanwhile is its turn
   * (`started`); a command, which leaves no turn in the record, is asked of the Sprite (`ask`); the rest are unsent, with a Send
   * again: they may not have reached the agent, or, `lost` (a resume's replay did not start them), never
   * did (`inRecord`). `turns` is null when the record could not be read. */
  async settleStarted(items, turns, lost = false) {
    const earlier = new Map(); // a session the messages were sent in -> its turns and those after it (null: not read)
    for (const item of items) {
      const { session } = item.dataset;
      if (!item.isConnected || !this.unsentItems.has(item)) continue; // a newer snapshot took over
      const entry = entryOf(item);
      if (shownIn(entry, turns)) {
        item.remove();
        this.unsentItems.delete(item);
        continue;
      }
      if (session && session !== this.session && !earlier.has(session)) {
        earlier.set(session, await turnsSince(this.request, session, new Set()).catch(() => null));
      }
      if (!item.isConnected || !this.unsentItems.has(item)) continue;
      const { verdict, said, unsure } = inRecord(entry, turns, earlier.get(session), lost);
      if (verdict === "unsent") this.unsent(item, said, true, unsure);
      else if (verdict === "ask") this.ask(item, said);
      else this.settled(item, verdict, said);
    }
    this.keepPending();
  }

  /** Shows a page of the record above the live events; resolves with its turns (null if not loaded). */
  async loadHistory(before) {
    const current = this.snapshot;
    let page;
    try {
      // Earlier turns of the session shown, named: a new session may have begun below them meanwhile.
      page = await this.conn.request("session_turns", before ? { session_id: this.history.session, before, limit: PAGE } : { limit: PAGE });
    } catch (error) {
      // Asked before a fresh snapshot rebuilt the list (below), its failure is not the new list's either.
      if (error.code !== "memory_unavailable" && current()) {
        this.notice(`The conversation so far could not be loaded: ${error.message}`, "error");
      }
      return null;
    }
    // Asked before a fresh snapshot rebuilt the list (a click as the socket reopened): its page is not the
    // new list's, whose own first page is on its way; nor is one of a session no longer shown.
    if (!current()) return null;
    if (this.history && this.history.session !== page.session.id) return null; // a newer snapshot took over
    const top = this.history?.button ?? this.list.firstChild;
    this.history?.button?.remove();
    const items = [];
    for (const turn of page.turns) {
      if (turn.turn_id && this.shown.has(turn.turn_id)) continue; // shown live already
      if (turn.turn_id) this.shown.add(turn.turn_id); // (a recorded turn's Retry has its own words)
      items.push(...pastTurnItems(turn, { retry: (text) => this.submit(text), forget: (which) => this.forget(which),
        session: page.session.id, from: (clientId) => (clientId ? this.from(clientId) : undefined) })); // (none: recorded before ids were)
    }
    // Pressed, its focus goes to the next page's button, or to the conversation when none is left (askingOnce).
    const earlier = async () => (await this.loadHistory(page.turns[0].turn)) && (this.history.button?.firstChild ?? this.list);
    const button = page.more ? el("li", { class: "load-earlier" }, el("button", { type: "button", testid: "load-earlier",
      text: "Show earlier turns", onclick: askingOnce(earlier) })) : null;
    const anchor = top && top.isConnected ? top : this.list.firstChild;
    for (const item of [button, ...items].filter(Boolean)) this.list.insertBefore(item, anchor);
    this.history = { session: page.session.id, more: page.more, button };
    if (page.session.cost_usd && !this.sessionCost.textContent) this.sessionCost.textContent = `This session: ${dollars(page.session.cost_usd)}`;
    this.list.dataset.history = "loaded";
    if (!before) this.toLatest();
    return page.turns;
  }

  startedItem(turnId, text, meta) {
    this.shown.add(turnId);
    this.texts.set(turnId, text);
    const item = this.add(messageItem("user", userText(text), meta));
    item.dataset.state = "started";
    item.dataset.turnId = turnId;
    return item;
  }

  started(frame) {
    // The page's own: waiting, or being looked for, or even said not sent (the server read it off a socket
    // the page had given up on only after the next socket's `ready`): its turn is what the server says.
    // Or answered already_taken while it waited (sent from another tab too): its turn is this one, shown once.
    const mine = frame.client_id ? this.queued.get(frame.client_id) ?? this.takenItems.get(frame.client_id)
      ?? [...this.unsentItems].find((item) => item.dataset.clientId === frame.client_id) : undefined;
    this.setAgent("running", frame.turn_id);
    if (mine) {
      this.queued.delete(frame.client_id);
      this.takenItems.delete(frame.client_id);
      this.unsentItems.delete(mine);
      mine.dataset.state = "started";
      mine.dataset.turnId = frame.turn_id;
      mine.querySelector(".meta")?.remove();
      this.shown.add(frame.turn_id);
      this.texts.set(frame.turn_id, frame.text);
    } else if (!this.shown.has(frame.turn_id)) {
      this.startedItem(frame.turn_id, frame.text, this.from(frame.client_id));
    }
  }

  /** Whether the message of client id `clientId` is this tab's own: waiting here, kept through a reload,
   * taken or shown unsent, or noted as sent from this tab (before a reload too: `sentHere`). */
  own(clientId) {
    if (!clientId) return false;
    return this.queued.has(clientId) || this.restored.has(clientId) || this.takenItems.has(clientId)
      || [...this.unsentItems].some((item) => item.dataset.clientId === clientId) || sentHere(clientId);
  }

  /** Where a message the agent took came from, by its client id: nothing when it is this tab's own (`own`). */
  from(clientId) {
    return this.own(clientId) ? undefined : sentFrom(clientId, browserId());
  }

  /** The answer as it is written. Words the page never got (written before it loaded, or while its link was
   * down: the streamed words are not replayed) are marked "…" where they are missing, until the whole answer
   * comes with the turn's `assistant_message`: the answer read as if it began mid-sentence, or ran on with
   * words left out. (A turn running when the page loaded, its first words not yet written, shows "…" too:
   * the page cannot tell; after a tool call of it the page saw, it can: `handle`.) */
  delta(frame) {
    const turn = this.turn(frame.turn_id);
    this.settleRetry(turn);
    const missed = this.unseen || (this.joined === frame.turn_id && !turn.stream);
    this.unseen = false;
    if (this.joined === frame.turn_id) this.joined = null;
    if (!turn.stream) {
      turn.stream = this.add(messageItem("assistant", el("div", { class: "text streaming", dir: "auto" })));
      turn.stream.dataset.state = "streaming";
      turn.stream.dataset.turnId = frame.turn_id;
    }
    const text = turn.stream.querySelector(".text");
    if (missed) text.append(el("span", { class: "stream-gap", testid: "stream-gap", text: text.childNodes.length ? " … " : "… " }));
    text.append(frame.text);
    this.grew();
  }

  assistant(frame) {
    const turn = this.turn(frame.turn_id);
    this.settleRetry(turn);
    const body = answerBody(frame.text);
    if (turn.stream) {
      clear(turn.stream.querySelector(".body")).append(body);
      turn.stream.dataset.state = "complete";
      turn.stream = null;
      this.grew();
    } else {
      const item = this.add(messageItem("assistant", body));
      item.dataset.state = "complete";
      item.dataset.turnId = frame.turn_id;
    }
  }

  toolUse(frame) {
    const tool = toolItem(frame.name, frame.summary);
    this.turn(frame.turn_id).tools.set(frame.tool_use_id, tool);
    tool.item.dataset.toolUseId = frame.tool_use_id;
    tool.item.dataset.turnId = frame.turn_id;
    this.add(tool.item);
  }

  toolResult(frame) {
    let tool = this.turn(frame.turn_id).tools.get(frame.tool_use_id);
    if (!tool) { tool = toolItem("a tool", ""); this.add(tool.item); }
    tool.result(frame.is_error, frame.summary);
    this.grew();
  }

  /** One line per turn while the model proxy fails, updated at each retry. */
  retrying(frame) {
    const turn = this.turn(frame.turn_id);
    const text = `${proxyTrouble(frame.error_status)}: trying again (attempt ${frame.attempt} of ${frame.max_retries}) in ${(frame.retry_delay_ms / 1000).toFixed(1)} s…`;
    if (!turn.retry) {
      turn.retry = this.add(el("li", { class: "notice retry", testid: "retry-line", dataset: { kind: "retry" } }));
      turn.retry.dataset.turnId = frame.turn_id;
    }
    turn.retry.textContent = text;
    turn.retry.dataset.attempt = String(frame.attempt);
    this.announce(text);
  }

  settleRetry(turn) {
    if (turn.retry && !turn.retry.dataset.settled) {
      turn.retry.textContent = `The model answered after ${turn.retry.dataset.attempt} ${turn.retry.dataset.attempt === "1" ? "retry" : "retries"}.`;
      turn.retry.dataset.settled = "true";
    }
  }

  completed(frame) {
    const turn = this.turn(frame.turn_id);
    if (turn.stream) { turn.stream.dataset.state = "complete"; turn.stream = null; }
    if (turn.retry && frame.status === "completed") this.settleRetry(turn);
    // A turn the server's stop cut short reads "stopped by the server" (statusItem), not as the person's Stop:
    // as its record does in Past sessions when it reached the CLI (one stopped before, unsent, has no record).
    const status = frame.status === "interrupted" && frame.by_server ? "stopped" : frame.status;
    const item = this.add(statusItem({ ...frame, status }));
    item.dataset.turnId = frame.turn_id;
    item.append(" · ", forgetControl("this turn", () => this.forget({ turn_ids: [frame.turn_id] })));
    if (frame.session_cost_usd) this.sessionCost.textContent = `This session: ${dollars(frame.session_cost_usd)}`;
    this.announce(status === "stopped" ? "The server stopped the agent's turn." : `The agent's turn ${status}.`);
    this.turns.delete(frame.turn_id);
    this.texts.delete(frame.turn_id); // its failure, if any, came before: its Retry holds the words
    if (this.running === frame.turn_id) this.setAgent("idle", null);
  }

  /** Forget turns for good; every device replaces them with a tombstone (turns_forgotten). False if refused. */
  async forget(which) {
    try {
      const done = await this.conn.request("forget_turns", which, { timeout: FORGET_TIMEOUT });
      this.notice(`Forgotten: its words are gone from the transcript, search and memory${done.restarted
        ? ". The session was restarted, so the agent's context no longer holds it" : ""}.`, "forgotten-done");
      return true;
    } catch (error) {
      this.notice(`Not forgotten: ${error.message}`, "error");
      return false;
    }
  }

  /** The server took this message before (a Send again from a duplicate of this tab, say): it did not
   * run it again. Marked taken, not refused: nothing for the person to do. */
  alreadyTaken(frame) {
    const item = frame.client_id ? this.queued.get(frame.client_id) : undefined;
    if (!item) return;
    this.queued.delete(frame.client_id);
    item.dataset.state = "taken";
    if (!(frame.turn_id && this.shown.has(frame.turn_id))) this.takenItems.set(frame.client_id, item); // its start is still to come
    this.meta(item).textContent = frame.turn_id && this.shown.has(frame.turn_id) ? SAID.takenShown : SAID.takenElsewhere;
    this.keepPending();
  }

  error(frame) {
    if (frame.code === "already_taken") { this.alreadyTaken(frame); return; }
    const text = frame.turn_id ? this.texts.get(frame.turn_id) : undefined;
    const retry = text && (frame.code === "model_unavailable" || frame.code === "agent_failed") ? () => this.submit(text) : null;
    const item = this.add(failureItem({ code: frame.code, message: frame.turn_id ? frame.message : `${frame.code.replaceAll("_", " ")}: ${frame.message}`, detail: frame.detail }, retry));
    const retries = frame.turn_id ? this.turn(frame.turn_id).retry : null;
    if (frame.turn_id) item.dataset.turnId = frame.turn_id;
    if (retries) {
      retries.textContent = `Gave up after ${retries.dataset.attempt} ${retries.dataset.attempt === "1" ? "retry" : "retries"}.`;
      retries.dataset.settled = "true";
    }
    const refused = frame.client_id ? this.queued.get(frame.client_id) : undefined; // which message, by its id
    if (refused) {
      this.queued.delete(frame.client_id);
      const { why, again } = refusal(frame.code, frame.message);
      this.unsent(refused, why, again);
    }
  }
}

/** A message of the tab's own, as kept_messages.js keeps it. */
function entryOf(item) {
  const { clientId: id, state, why, stream, session, unsure } = item.dataset;
  return { id, text: item.querySelector(".text").textContent, state, why, stream, session, unsure: unsure === "true" };
}
