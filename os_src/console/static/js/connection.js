// The one WebSocket to the Sprite: authentication, hello and resume by seq, reconnection
// with backoff, and requests answered by request_id (the memory frames).
//
// A tab can be shared: after Sign out the next person signs in on the same page, and nothing of the
// one who left may show. The rule is kept here, once, not by every view: each request belongs to the
// sign-in it was made under (`signIn`, taken when it is made), and one whose sign-in ended (Sign out,
// a refused token) never settles: no answer, no error, no timeout. The view's code after its `await`,
// its `catch` too, simply never runs, so a view's `catch` only ever sees the current sign-in's errors
// and needs no check of its own. (A rejection with a "signed out" code would ask every `catch` to tell
// it apart, the check a new view forgets; never settling asks nothing.) Two things stay the view's: a
// `finally` does not run either, so a busy mark it would clear is the view's `signOut()` to clear; and
// a flow that waits on something else between two requests (a file read, a pause between retries)
// takes its sign-in first and asks under it (`{ signIn }`, as files.js's `asker()`), or its later
// requests would go out under the next sign-in. The promise, its callbacks dropped, is freed.
//
// A browser cannot read the HTTP status of a refused WebSocket handshake, so when a socket
// closes before it ever opened, the page asks GET /console/auth (the token in a header) to
// tell a wrong token (401) or a page origin the server refuses (403) (say so, and stop)
// from a server that is away (retry, slower each time): a wrong token never causes a storm.
//
// A socket can die without closing: a laptop asleep, a network that changed under it. The browser then
// says nothing for many minutes (TCP gives up after about 15), while the page shows "connected" and a
// message sent waits for an agent that never hears it. So the page listens (`listen`): after QUIET with
// nothing from the Sprite it asks (`ping`, answered `pong`), and a link that then brings nothing at all
// for PATIENCE more is dropped as dead, and the page reconnects, resuming from the last event it saw. Any
// frame counts as an answer (a pong can be queued behind a download's chunks on a slow link). The clock is
// the wall's: a machine that slept wakes with the quiet spell long over, and asks at the next check. A clock
// set back counts from the moment it was set back to (else the quiet spell, counted from a moment in its
// future, would last as long as it went back), and whether the asking was answered is a count of frames,
// not a comparison of times the step back would turn over. A
// frame the page sends after CHECK of quiet (a message typed on waking) asks at once, so a dead link is
// noticed PATIENCE after it, not a quiet spell later.
//
// A frame still on its way is life the page cannot see: a browser hands a WebSocket message over only
// once it is whole. On a slow link one big frame (a long answer, a card, a page of the record) can take
// longer than QUIET and PATIENCE together, the ping's answer queued behind it: the page dropped the link
// as dead, resumed, and the Sprite sent the frame again, to be dropped again, for ever (measured: 300,000
// characters of text at 32 kbit/s, dropped every 45 s, never shown). The first such drop the page cannot
// avoid; but a resume's `ready` says how many events it replays (`replayed`), so while some of those are
// still due, a link that answers nothing is given AWAITED, not PATIENCE, before it counts as dead. A pong
// comes after every frame queued before it: once one is in, none is due (a count larger than what came
// does not hold the longer patience for the socket's life).

const SUBPROTOCOL = "sprite-os.v1";
const FIRST_DELAY = 0.5; // seconds; doubled after each failed attempt
const MAX_DELAY = 30;
const REQUEST_TIMEOUT = 30_000;
const QUIET = 25_000; // ms with nothing from the Sprite before the page asks it whether the link still holds
const PATIENCE = 15_000; // ms more with nothing at all before the link counts as dead
const CHECK = 5_000; // ms between two looks at the link
const AWAITED = 180_000; // ms of patience while events the Sprite said it replays are still due

export class Connection {
  constructor({ onFrame, onStatus, onAuthFailed, quiet = QUIET, patience = PATIENCE, awaited = AWAITED }) {
    this.onFrame = onFrame;
    this.onStatus = onStatus;
    this.onAuthFailed = onAuthFailed;
    Object.assign(this, { quiet, patience, awaited, check: Math.min(CHECK, quiet / 2) });
    this.due = 0; // events the open socket's `ready` said it replays, still to come
    this.heard = 0; // when the open socket last brought a frame (Date.now())
    this.pinged = null; // when the page last asked whether the link holds
    this.frames = 0; // frames the open socket brought so far
    this.answered = 0; // `frames` when the page asked: unanswered while it is still the count
    this.watch = null; // the open socket's `listen` timer
    this.ws = null;
    this.token = null;
    this.lastSeq = null; // the largest seq seen of the server run's (`stream`): where to resume from
    this.stream = null;
    this.everReady = false;
    this.attempt = 0; // failed attempts since the last open socket
    this.links = 0; // sockets opened so far: what a frame was sent on (a message sent before this socket's ready)
    this.retryTimer = null;
    this.pending = new Map(); // request_id -> {resolve, reject, timer}
    this.signIn = newSignIn(); // the sign-in requests are made under now
    this.nextRequest = 1;
    window.addEventListener("online", () => { this.retryNow(); this.ask(); }); // a network back: is the link?
    document.addEventListener("visibilitychange", () => { if (!document.hidden) this.ask(); });
  }

  get url() {
    return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/`;
  }

  /** Whether a frame can go now: the socket is open (its `ready` may still be on its way). What the
   * page's Send button and Enter both go by (`send`). */
  get connected() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  start(token) {
    this.token = token;
    this.connect();
  }

  /** Sign out. The next sign-in is a first connection (a fresh snapshot), not a resume of this one. The
   * sign-in ends (`endSignIn`): its requests in flight never settle, their answers and their timeouts
   * were the person's who signed out, never the next one's. */
  stop() {
    this.endSignIn("signed out");
    this.token = null;
    Object.assign(this, { lastSeq: null, stream: null, everReady: false, attempt: 0 });
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    clearInterval(this.watch);
    if (this.ws) this.ws.close(1000, "signed out");
    this.ws = null;
  }

  connect() {
    this.retryTimer = null;
    if (!this.token) return;
    let ws;
    try {
      ws = new WebSocket(this.url, [SUBPROTOCOL, `bearer.${this.token}`]);
    } catch {
      this.token = null;
      this.endSignIn("refused");
      this.onAuthFailed("This token has characters a browser cannot send; check it and try again.");
      return;
    }
    this.ws = ws;
    this.links += 1;
    let opened = false;
    this.onStatus({ state: this.everReady ? "reconnecting" : "connecting", attempt: this.attempt });
    ws.addEventListener("open", () => {
      opened = true;
      this.attempt = 0;
      this.heard = Date.now();
      this.pinged = null;
      this.due = 0;
      clearInterval(this.watch);
      this.watch = setInterval(() => this.listen(ws), this.check);
      const hello = { type: "hello", protocol: 1, client: "sprite-console" };
      if (this.lastSeq !== null && this.stream) Object.assign(hello, { last_seq: this.lastSeq, stream: this.stream });
      ws.send(JSON.stringify(hello));
      // Open, its `ready` still to come: a message may go now (the server reads it after its snapshot),
      // so the page's Send is told, as Enter is by `send` (`connected`: the one rule for both).
      this.onStatus({ state: this.everReady ? "reconnecting" : "connecting", attempt: this.attempt });
    });
    ws.addEventListener("message", (event) => {
      const current = this.ws === ws;
      if (current) Object.assign(this, { heard: Date.now(), frames: this.frames + 1, due: Math.max(0, this.due - 1) });
      this.receive(event.data, current);
    });
    ws.addEventListener("close", (event) => this.lost(ws, opened, event.code));
  }

  /** `ws` closed (or dropped as dead, `listen`): the page reconnects, or asks why a socket never opened. */
  lost(ws, opened, code) {
    if (this.ws !== ws) return;
    this.ws = null;
    clearInterval(this.watch);
    this.failPending("the connection was lost before the answer came");
    if (!this.token) return;
    if (opened) this.retry(code === 4000 ? 0 : FIRST_DELAY);
    else this.diagnose();
  }

  /** A look at the open socket `ws`: asked after a quiet spell, dropped when the asking brought nothing. */
  listen(ws) {
    if (this.ws !== ws) return;
    const now = Date.now();
    this.heard = Math.min(this.heard, now); // a clock set back: counted from now
    if (this.pinged !== null) this.pinged = Math.min(this.pinged, now);
    if (this.asking) {
      const waited = now - this.pinged;
      if (waited < this.patience || (this.due > 0 && waited < this.awaited)) return;
      ws.close(1000, "no answer"); // its close event, if one ever comes, is no longer the page's
      this.lost(ws, true, 0);
      return;
    }
    if (now - this.heard >= this.quiet) this.ask();
  }

  /** Whether the page asked the Sprite about the link, and nothing came since. */
  get asking() {
    return this.pinged !== null && this.frames === this.answered;
  }

  /** Asks the Sprite whether the link holds (`listen` judges the answer), unless it is asked already. */
  ask() {
    if (!this.connected || this.asking) return;
    Object.assign(this, { pinged: Date.now(), answered: this.frames });
    this.send({ type: "ping" });
  }

  /** A frame from the Sprite (`current`: on the open socket), handed on with `skipped`: events went by
   * between the last one seen and it, unseen (a resume replays every event but the streamed words, and a
   * forgotten turn's). A fresh snapshot (`ready` with `resync`, or of another server run) starts the count
   * again: a restarted server numbers its events from 1, and a `last_seq` of the run before, larger, would
   * make the next resume a fresh snapshot too. */
  receive(data, current = true) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    let skipped = false;
    if (typeof frame.seq === "number") {
      const fresh = frame.type === "ready" && (frame.resync || frame.stream !== this.stream);
      skipped = !fresh && this.lastSeq !== null && frame.seq > this.lastSeq + 1;
      this.lastSeq = fresh ? frame.seq : Math.max(this.lastSeq ?? 0, frame.seq);
    }
    // A pong comes after every frame the Sprite queued before it: none it announced is still due then.
    if (frame.type === "pong" && current) this.due = 0;
    if (frame.type === "ready") {
      if (current) this.due = frame.replayed || 0; // the events that follow it
      const resumed = this.everReady;
      this.stream = frame.stream;
      this.everReady = true;
      this.onStatus({ state: "connected", resumed, replayed: frame.replayed, resync: frame.resync });
    }
    const waiting = frame.request_id != null ? this.pending.get(frame.request_id) : undefined;
    if (waiting) {
      this.pending.delete(frame.request_id);
      clearTimeout(waiting.timer);
      if (frame.type === "error") waiting.reject(new RequestError(frame.code, frame.message));
      else waiting.resolve(frame);
      return;
    }
    this.onFrame(frame, { skipped });
  }

  async diagnose() {
    const { signIn } = this; // the sign-in asking: its answer is never the next one's
    let status = 0;
    try {
      const headers = { Authorization: `Bearer ${this.token}`, "X-Sprite-Origin": location.origin };
      const answer = await fetch("/console/auth", { headers, cache: "no-store" });
      status = answer.status;
    } catch {
      status = 0; // the server is not reachable: it is away, not refusing
    }
    // Ended meanwhile (Sign out; the answer can be slow, a Sprite waking): a 401 would end the next
    // sign-in, a retry set a second socket going beside its own.
    if (signIn.signal.aborted) return;
    if (status === 401 || status === 403) {
      this.token = null;
      // A transfer waiting to ask again asks nothing more (its next try would go out under whichever
      // sign-in comes next). No request is in flight here: the socket's close failed them all first, so
      // none is left unsettled with a `finally` to run (keep this after that close).
      this.endSignIn("refused");
      this.onAuthFailed(status === 401
        ? "The Sprite refused this token. Check it (it is in .os/token on the Sprite) and sign in again."
        : `The Sprite does not accept connections from pages at ${location.origin}: add it to SPRITE_OS_ALLOWED_ORIGINS.`);
      return;
    }
    this.retry(Math.min(MAX_DELAY, FIRST_DELAY * 2 ** this.attempt));
  }

  retry(base) {
    this.attempt += 1;
    const delay = base * (0.8 + Math.random() * 0.4); // jitter: many tabs don't return in step
    this.onStatus({ state: "waiting", attempt: this.attempt, delay });
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.connect(), delay * 1000);
  }

  retryNow() {
    if (this.retryTimer !== null) {
      clearTimeout(this.retryTimer);
      this.connect();
    }
  }

  /** Sends a frame; false if not connected (the caller says so). */
  send(frame) {
    if (!this.connected) return false;
    this.ws.send(JSON.stringify(frame));
    if (frame.type !== "ping" && Date.now() - this.heard >= this.check) this.ask(); // into a link quiet for a while
    return true;
  }

  /** A memory request: resolves with its `<type>_result` frame, rejects with a RequestError, under the
   * sign-in now, or `signIn`, one taken before (a transfer's: its retries are asked under the sign-in it
   * began in). Under a sign-in that has ended, it never settles, and nothing is sent. */
  request(type, fields = {}, { timeout = REQUEST_TIMEOUT, signIn = this.signIn } = {}) {
    if (signIn.signal.aborted) return new Promise(() => {});
    const id = `r${this.nextRequest++}`;
    return new Promise((resolve, reject) => {
      if (!this.send({ type, request_id: id, ...fields })) {
        reject(new RequestError("not_connected", "Not connected to the Sprite right now."));
        return;
      }
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RequestError("timeout", "The Sprite did not answer in time."));
      }, timeout);
      this.pending.set(id, { resolve, reject, timer });
    });
  }

  failPending(message) {
    for (const { reject, timer } of this.pending.values()) {
      clearTimeout(timer);
      reject(new RequestError("connection_lost", message));
    }
    this.pending.clear();
  }

  /** Ends the sign-in (`why`: "signed out", or "refused" for a refused token, its signal's reason): its
   * requests in flight are dropped unsettled, their timeouts cleared, its signal aborts (a transfer's
   * pause between retries wakes, and asks under it: nothing), and the requests made from now on are the
   * next sign-in's. */
  endSignIn(why) {
    for (const { timer } of this.pending.values()) clearTimeout(timer);
    this.pending.clear();
    const ended = this.signIn;
    this.signIn = newSignIn();
    ended.end(why);
  }
}

/** A sign-in: its `signal`, aborted when it ends (`end`). Each is its own object: the one a request was
 * made under is the one that ends it. */
function newSignIn() {
  const ending = new AbortController();
  return { signal: ending.signal, end: (reason) => ending.abort(reason) };
}

/** Waits for a request a click set going, saying its failure through `flash`: never an unhandled rejection.
 * (One Sign out ended never fails: see the top of this file.) */
export async function told(request, flash) {
  try {
    await request;
  } catch (error) {
    flash(error.message, "error");
  }
}

export class RequestError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}
