// The person's messages not yet answered, as the chat keeps them (chat.js shows them): the tab's
// sessionStorage copy kept through a reload, and the rules that settle each one against what the
// server says it ran, always by the client id it went with, never by its words: `ready` (the
// messages it still holds, the running turn's), a refusal or `already_taken`, and the record's
// turns (the console API's session_turns). No DOM here: entries in, decisions and words out.
//
// An entry: {id: its client id, text, state, why, stream: the server run it went to, session,
// unsure: said unsent only because the page could not tell}.

import { localStore, sessionStore } from "./storage.js";

// sessionStorage: per tab (another tab must not take them for its own), gone with it.
const KEY = "sprite-os.pending";
const SINCE_PAGE = 100; // turns asked for at a time by the restart check (the most a page holds)
const SINCE_PAGES = 10; // past this many, the restart check does not know
const REFUSED = { // what a message the server refused says beside its Send again, by the error's code
  queue_full: "not accepted: too many messages are waiting.",
  shutting_down: "not accepted: the Sprite is stopping.",
  rate_limited: "not accepted: too many messages too fast.",
};

/** What a kept message says beside its words, while it is not settled, and once it is. */
export const SAID = {
  waiting: "waiting for the agent…",
  checking: "looking whether the agent took it…",
  restartChecking: "the Sprite restarted: looking whether the agent took it…",
  lost: "not sent: the connection was lost before the Sprite got it.",
  unsure: "this may not have reached the agent (the conversation above shows what it recorded).",
  takenShown: "the agent took it already: its turn is above; it was not run again.",
  takenElsewhere: "the agent took it already (sent from another tab, or before a restart): it was not run again.",
  takenEnded: "the agent took it in a session that has ended since: what it did is in Past sessions.",
  refused: "not sent.",
  connecting: "kept from before the reload: waiting for the connection to the Sprite…",
  asking: "a command, which leaves no turn in the record: asking the Sprite whether it ran it…",
  command: "a command: the Sprite cannot say whether it ran this one (it does not know the commands an"
    + " earlier run took: its memory is off or was unreadable at start, or it is an older version), so"
    + " it is not offered again (type it again if it did not).",
};

/** A command (/compact, say): the CLI may run it itself, with no model turn, and then the record keeps
 * no turn of it (the server takes a message beginning with "/" for one), only its client id among the
 * ids the agent took. So a check that does not find it asks the server (verdict "ask": sent again with
 * its own id, it is refused `already_taken` if the agent took it, and runs now, once, if it never did).
 * When the record could not be read (memory off, or failing) the server may not know it either: then it
 * is not offered again (verdict "command"). */
function command(text) {
  return text.startsWith("/");
}

// The browser's own id, in every client id its tabs make (`web.<browser>.…`): localStorage, which the
// browser's tabs share, so a tab knows a message another of them sent (`sentFrom`). A random word, none
// of the person's, kept through Sign out. Null where the page may not keep it (storage denied): its
// client ids then name no browser (`web-…`), and no tab takes them for its own browser's.
//
// Two tabs opened in the same instant, with none kept yet, each looked, found none and made one, kept
// for its life: each then said the other's messages came "from another browser or device". So the id is
// made under a Web Lock of its name (`makeBrowserId`), which the browser's tabs share: the second tab to
// take it finds the first one's id. And a tab reads the id the browser keeps at each use (`browserId`),
// never a copy of its own: where there are no locks (a page not served over https or from localhost) two
// tabs may still both make one, and the browser keeps the last written, which both then go by.
const BROWSER_KEY = "sprite-os.browser";
const BROWSER_ID = /^[a-z0-9]{8,16}$/;

/** The id the browser keeps now, or null (none yet, or storage denied). */
export function browserId() {
  const id = localStore.get(BROWSER_KEY);
  return BROWSER_ID.test(id ?? "") ? id : null;
}

/** Makes the browser's id if it has none; returns it (null: none can be kept). */
function ensureBrowserId() {
  // storage denied: none is kept, the client ids name no browser
  if (!browserId()) localStore.set(BROWSER_KEY, Math.random().toString(36).slice(2, 12).padEnd(8, "0"));
  return browserId();
}

/** Makes the browser's id at a tab's start, once for all its tabs: under their shared lock where the
 * browser has one. Settles with the id (null: none can be kept); never fails. */
export async function makeBrowserId() {
  try {
    if (navigator.locks) return await navigator.locks.request(BROWSER_KEY, ensureBrowserId);
  } catch { /* no lock to be had here (an opaque origin): made without it */ }
  return ensureBrowserId();
}

/** The id for a client id the tab makes now: the browser's, made now if the tab's start has not yet. */
export function sendingBrowserId() {
  return browserId() ?? ensureBrowserId();
}

/** Where a message the page did not send came from, as far as its client id tells (`browser`: this
 * page's browserId()): another tab of this browser, another browser, another app (the command line's
 * `sprite-os chat`, say), or, where the page cannot tell (its storage denied, or the sender's), either. */
export function sentFrom(clientId, browser) {
  const web = /^web([.-])(?:([a-z0-9]+)\.)?/.exec(clientId ?? "");
  if (!web) return "from another app or device";
  if (!browser || web[1] === "-") return "from another tab or device";
  return web[2] === browser ? "from another tab of this browser" : "from another browser or device";
}

// The client ids of the messages this tab sent (the newest SENT_KEPT), in its sessionStorage: a reload
// in the middle of one's turn finds it in no kept message (it left them when its turn started), and the
// page, told the running turn's client id (`ready.turn_client_id`), knows the message for its own; so it
// does of the record's turns it reads back (their `client_id`), marking only the others' as from elsewhere.
const SENT_KEY = "sprite-os.sent";
const SENT_KEPT = 200; // about 8 kB

function readSent() {
  try {
    const sent = JSON.parse(sessionStore.get(SENT_KEY) || "[]");
    return Array.isArray(sent) ? sent : [];
  } catch {
    return [];
  }
}

/** Notes a message this tab sent (`id`, its client id); none (null) forgets them all (Sign out). */
export function noteSent(id) {
  // storage full or denied: a reload mid-turn then says where its message came from as it can
  if (id === null) sessionStore.remove(SENT_KEY);
  else sessionStore.set(SENT_KEY, JSON.stringify([...readSent().filter((sent) => sent !== id), id].slice(-SENT_KEPT)));
}

/** Whether this tab sent the message of client id `id` (before a reload too). */
export function sentHere(id) {
  return Boolean(id) && readSent().includes(id);
}

/** The messages this tab kept for a reload ([] if none, or unreadable). */
export function readKept() {
  try {
    const kept = JSON.parse(sessionStore.get(KEY) || "[]");
    return Array.isArray(kept) ? kept.filter((entry) => entry && typeof entry.id === "string" && typeof entry.text === "string") : [];
  } catch {
    return [];
  }
}

/** Keeps the tab's unsettled messages for a reload; none left, none kept (at Sign out too: the person's
 * words leave the tab, as the draft does). */
export function keep(entries) {
  // the tab's storage full (or denied): nothing kept (a stale list would come back), the page goes on
  if (!entries.length || !sessionStore.set(KEY, JSON.stringify(entries))) sessionStore.remove(KEY);
}

/** A message the server refused: what it says, and whether Send again can succeed (`again`): refused
 * for what it is (too long, malformed), the same words would be refused again. */
export function refusal(code, message) {
  return { why: REFUSED[code] ?? `not accepted: ${message}`, again: code in REFUSED };
}

/** The client ids a `ready` says the server holds: waiting for the agent, or the running turn's. */
export function held(frame) {
  return new Set([...(frame.waiting ?? []), frame.turn_client_id]);
}

/** A kept message a refusal or a check said unsent: so it stays, with its Send again, until sent. One
 * that only may not have reached the agent (`unsure`: the record could not be read, or held a turn
 * without a client id) is not: after a reload it is looked for again, as a waiting one is. */
export function unsentFor(entry) {
  return entry.state === "refused" && !entry.unsure;
}

/** Where a message kept through a reload, not said unsent, stands at the first `ready`: "running" (it
 * is the running turn, shown as it), "restarted" (sent to a server run that has stopped since: the
 * restart check), "waiting" (the server still holds it), or "unsure" (the same server no longer holds
 * it: it started, its turn in the record, or was refused meanwhile). */
export function standing(entry, frame) {
  if (entry.id === frame.turn_client_id) return "running";
  if (entry.stream !== frame.stream) return "restarted";
  return (frame.waiting ?? []).includes(entry.id) ? "waiting" : "unsure";
}

/** The turns of `session` since the newest one the page showed (`shown`), and every turn of each
 * session the old server began after it (a new session or a forget asked for from another device
 * while this page's link was quiet), oldest first. Every one: a page of the newest alone left out a
 * message taken before another device's many turns, and the page called it not sent. Past
 * SINCE_PAGES pages it throws (not known). `request` is the connection's. */
export async function turnsSince(request, session, shown) {
  const { sessions } = await request("sessions", { limit: 20 }); // newest first
  const known = sessions.find((s) => s.id === session);
  const ids = known ? sessions.filter((s) => !s.current && s.started_at >= known.started_at).map((s) => s.id).reverse() : [session];
  const turns = [];
  for (const id of ids) {
    const since = [];
    for (let before = null, pages = 0; ; pages++) {
      if (pages === SINCE_PAGES) throw new Error("too many turns to look through");
      const page = await request("session_turns", { session_id: id, limit: SINCE_PAGE, ...(before ? { before } : {}) });
      since.unshift(...page.turns);
      if (!page.more || page.turns.some((turn) => shown.has(turn.turn_id))) break;
      if (!page.turns.length) throw new Error("the record's pages did not go back");
      before = page.turns[0].turn;
    }
    turns.push(...since);
  }
  return turns;
}

/** The turns the old server ran that the page never showed (`left`: the session it ran and the turn ids
 * the page showed), oldest first; null when not known (no session, or the record could not be read). */
export async function unseenSince(request, left) {
  if (!left.session) return null;
  try {
    return (await turnsSince(request, left.session, left.shown)).filter((turn) => turn.turn_id && !left.shown.has(turn.turn_id));
  } catch {
    return null; // not known: offered again, and said so
  }
}

/** The restart check's word on a message that was waiting when the server restarted. The old server
 * may have taken it after the page's link went quiet (its turn is then in `unseen`, the turns it ran
 * that the page never showed; null: not known) or dropped it with its queue. Found by the client id it
 * went with, never by its words: the record holds private words left out, and another device may have
 * sent the same words meanwhile. "Not sent" only when every unseen turn names its message: a turn
 * recorded without a client id (a client that sends none) could be any message, so then the page says
 * it does not know. (No match by words for turns from before the record kept client ids: a page running
 * this code was loaded from a server that keeps them, and the old server's turns without one are just
 * as likely another client's.) A command the record does not hold is asked of the server (`ask`), or,
 * the record unread, said so (`command`). Returns {verdict: "taken", "ask", "command" or "unsent", said,
 * unsure}. */
export function afterRestart({ id, text }, unseen) {
  const turn = id && unseen ? unseen.find((t) => t.client_id === id) : undefined;
  // Only a completed turn has an answer; one the server's stop or a kill cut is "stopped"; one that
  // failed (an error) or that a person interrupted from another device did not finish either.
  if (turn) {
    return { verdict: "taken", said: turn.status === "completed"
      ? "the agent took it before the Sprite restarted: its answer is in Past sessions."
      : turn.status === "stopped" ? "the agent took it, but the restart cut its turn short: what it did is in Past sessions."
        : "the agent took it, but its turn did not finish: what it did is in Past sessions." };
  }
  if (command(text)) return unseen === null ? { verdict: "command", said: SAID.command } : { verdict: "ask", said: SAID.asking };
  // Every turn the old server ran is placed: each names the message it came from, and none is this one.
  const known = unseen !== null && unseen.every((t) => t.client_id);
  return { verdict: "unsent", unsure: !known, said: known ? "not sent: the Sprite restarted before the agent took it."
    : "the Sprite restarted: this may not have reached the agent (Past sessions shows what it recorded)." };
}

/** Whether the message's turn is among `turns` (the history the conversation shows; null: not read). */
export function shownIn({ id }, turns) {
  return Boolean(turns?.some((turn) => turn.client_id === id));
}

/** Whether a message the page does not know the server has is settled by the record: {verdict: "shown"}
 * (its turn is among `turns`, the history the conversation shows), "taken" (among `earlier`, the turns
 * of the ended session it was sent in and those after it), "ask" or "command" (a command, which the record does
 * not keep), or "unsent", with what it says (`lost`: the events the server replayed on a resume did not
 * start it, so it never reached the server, command or not; else it may not have, `unsure`). Either
 * list may be null (not read). */
export function inRecord({ id, text }, turns, earlier, lost = false) {
  if (shownIn({ id }, turns)) return { verdict: "shown" };
  if (earlier?.some((turn) => turn.client_id === id)) return { verdict: "taken", said: SAID.takenEnded };
  if (!lost && command(text)) return turns === null ? { verdict: "command", said: SAID.command } : { verdict: "ask", said: SAID.asking };
  return { verdict: "unsent", said: lost ? SAID.lost : SAID.unsure, unsure: !lost };
}
