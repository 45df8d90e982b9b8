// The person's files: browse their workspace (never .os/, never through a link), download a
// file, and upload by picking or dropping files (they land in documents/, and the agent is told
// with the next message). Both go over the socket in chunks; a chunk refused for rate, or lost with
// the connection, is sent again after a pause that doubles, and the person sees it retrying. Sign out
// ends every transfer, one waiting between retries too (each asks under the sign-in it began in, which
// the connection ends: see connection.js), and the view keeps nothing of the person.

import { askingOnce, clear, count, el, keepingFocus, newest, size, when } from "./dom.js";

const UPLOADS = "documents";
// Bidi controls (U+202E can make "gnp.exe" read as "exe.png") and the marks that steer them: shown
// as their code in a name, so a name reads as the characters it has.
const BIDI = /[\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]/g;

/** A file or folder name as shown: every bidi control visible as [U+XXXX]. */
export function shownName(name) {
  return name.replace(BIDI, (c) => `[U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}]`);
}

function base64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function unbase64(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 1) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

// What a chunk is asked for again after: the server dropped it for rate or because the connection's
// requests queue was full (it was never handled), or the connection went (it reconnects by itself
// meanwhile). Not a timeout: its answer may still be on the way, behind the others queued on a slow
// link, and asking again would queue another ~700 KB answer behind it.
const RETRYABLE = new Set(["rate_limited", "queue_full", "busy", "connection_lost", "not_connected"]);
// A request that changes something when handled (starting or finishing a transfer) is asked again
// only when it was never handled: a lost answer could hide that it was. `not_connected`: never sent
// (the socket was down: the files queued behind one a lost link failed wait for the reconnect).
const DROPPED = new Set(["rate_limited", "queue_full", "not_connected"]);
const RETRIES = 8; // 0.5 s, 1 s, 2 s, 4 s, then 8 s each: about 40 s in all

/** `ask()`, asked again on a retryable error after a growing pause; `onRetry(attempt)` before each wait.
 * `ended` (an AbortSignal) cuts a pause short: `ask()` is then asked once more, and is to ask nothing
 * (a request under a sign-in that ended never settles). */
export async function retried(ask, onRetry, codes = RETRYABLE, ended = null) {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await ask();
    } catch (error) {
      if (!codes.has(error.code) || attempt > RETRIES) throw error;
      onRetry(attempt, error);
      if (ended?.aborted) continue; // ended already: no pause to cut short
      const delay = Math.min(8, 0.5 * 2 ** (attempt - 1)) * (0.8 + Math.random() * 0.4);
      await new Promise((resolve) => {
        const wake = () => { clearTimeout(timer); resolve(); };
        const timer = setTimeout(() => { ended?.removeEventListener("abort", wake); resolve(); }, delay * 1000);
        ended?.addEventListener("abort", wake, { once: true });
      });
    }
  }
}

/** A signal that aborts with the first of `signals` to abort, as `AbortSignal.any` (which Safari before 17.4
 * and Chromium before 116 lack: every upload failed on them), and `release()`, which stops it listening. */
function either(...signals) {
  const any = new AbortController();
  const listening = new AbortController();
  for (const signal of signals) {
    if (signal.aborted) any.abort();
    signal.addEventListener("abort", () => any.abort(), { once: true, signal: listening.signal });
  }
  return { signal: any.signal, release: () => listening.abort() };
}

/** Settled once `signal` aborts. */
function aborted(signal) {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", resolve, { once: true });
  });
}

/** The files of a drop, and the names of the folders in it: a folder comes as an empty "file" of its
 * name, which the upload would either fail to read or store empty. Read while the drop event lasts
 * (its items are gone after it). */
export function dropped(dataTransfer) {
  const files = [];
  const folders = [];
  const items = [...(dataTransfer?.items || [])].filter((item) => item.kind === "file");
  if (!items.length) return { files: [...(dataTransfer?.files || [])], folders };
  for (const item of items) {
    const file = item.getAsFile();
    if (item.webkitGetAsEntry?.()?.isDirectory) folders.push(file?.name || "a folder");
    else if (file) files.push(file);
  }
  return { files, folders };
}

async function sha256(file) {
  if (!globalThis.crypto?.subtle) return null; // only on https or localhost; the size is still checked
  const digest = await crypto.subtle.digest("SHA-256", await file.arrayBuffer());
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// Chromium drops a file handed to it to save when many come at once, and tells neither the page nor the
// person: 16 downloads clicked in a row, whose last chunks came together, saved 11 (the first ten and the
// last), every line saying "downloaded". Measured in its headless shell: 30 hand-offs at once saved 10, 50
// ms apart 11 of 20, 100 ms apart or more all 30. So the page hands them over one at a time, SAVE_GAP apart.
const SAVE_GAP = 250; // ms
let saving = Promise.resolve();

/** Hands `blob` to the browser to save as `name`, after those handed before it, SAVE_GAP after the last;
 * not if the sign-in it was downloaded under ended meanwhile (`ended`: the next person's browser window).
 * True once handed over: the gap after it holds up the next one, not this one's "downloaded" (a sign-in
 * ending in it would say a file saved already stopped, to be downloaded again). */
function handToBrowser(blob, name, ended) {
  const handed = saving.then(() => {
    if (ended.aborted) return false;
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: name, class: "visually-hidden" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    return true;
  });
  // One the browser would not take (its line says why) holds up none after it.
  saving = handed.then((done) => done && new Promise((resolve) => { setTimeout(resolve, SAVE_GAP); }), () => {});
  return handed;
}

export class FilesView {
  constructor(root, connection) {
    this.root = root;
    this.conn = connection;
    this.path = "";
    this.stopped = []; // the names of the transfers a refused token stopped, for the sign-in form to say
    // A folder opened while another's listing was on its way (the tab shown again, an upload's reload):
    // the newest asked is the one shown, never the folder the person left.
    this.listings = newest();
    this.letting = new Set(); // the downloads cancelled, until the Sprite let them go (`download`)
    this.crumbs = el("nav", { class: "crumbs", "aria-label": "Folder" });
    this.picker = el("input", { type: "file", multiple: true, class: "visually-hidden", id: "upload-picker", testid: "upload-input",
      tabindex: "-1", "aria-label": "Files to upload" });
    this.picker.addEventListener("change", () => { this.uploadAll([...this.picker.files]); this.picker.value = ""; });
    const pick = el("button", { type: "button", class: "primary", testid: "upload-button", text: "Upload files…", onclick: () => this.picker.click() });
    this.flash = el("p", { class: "flash", testid: "files-flash", role: "status" });
    this.progress = el("ul", { class: "uploads", testid: "uploads", "aria-label": "Uploads and downloads" });
    this.table = el("div", { class: "file-table" });
    this.drop = el("div", { class: "drop", testid: "drop-zone" },
      el("div", { class: "files-head" }, el("h2", { text: "Your files" }), pick, this.picker),
      el("p", { class: "hint", text: "Everything in your Sprite's workspace but its system folder (.os). Uploads, picked or dropped here, go to documents/ and the agent hears of them with your next message." }),
      this.crumbs, this.flash, this.progress, this.table);
    for (const kind of ["dragenter", "dragover"]) { // files only: text or a link is no upload (the cursor says so)
      this.drop.addEventListener(kind, (event) => {
        if (!event.dataTransfer?.types.includes("Files")) return;
        event.preventDefault();
        this.drop.classList.add("dropping");
      });
    }
    this.drop.addEventListener("dragleave", (event) => { if (!this.drop.contains(event.relatedTarget)) this.drop.classList.remove("dropping"); });
    this.drop.addEventListener("drop", (event) => {
      event.preventDefault();
      this.drop.classList.remove("dropping");
      this.uploadDropped(dropped(event.dataTransfer));
    });
    root.append(this.drop);
  }

  handle(frame) {
    if (frame.type === "file_uploaded" && !this.root.hidden && (this.path === "" || this.path === UPLOADS)) this.show(this.path);
  }

  /** Sign out: the view forgets the person: their transfer lines, the last thing said, the folder shown
   * and its path. (Their transfers, one waiting between retries too, ended already with the sign-in:
   * `connection.stop()`, and the abort each transfer listens for.) */
  signOut() {
    this.listings.forget(); // a listing still on its way is not drawn
    this.stopped = [];
    this.letting.clear(); // the person's cancelled downloads: the next one's wait for none of them
    this.path = "";
    delete this.root.dataset.path;
    for (const kept of [this.crumbs, this.progress, this.table]) clear(kept);
    this.say("");
    delete this.flash.dataset.kind;
  }

  /** A transfer's requests, under the sign-in it began in: once that ended, none of it, a retry or its
   * next chunk, goes over the next person's connection (the connection asks nothing, and it never
   * settles); `signal` aborts then, and cuts a pause between retries short. */
  asker() {
    const { signIn } = this.conn;
    return { ask: (type, fields) => this.conn.request(type, fields, { signIn }), signal: signIn.signal };
  }

  /** `asker()` for a transfer with a Cancel: once `cancel()` is called, `ask` asks nothing more (it fails
   * with "cancelled") and `signal` cuts a pause between retries short, as the sign-in's end does (`ended`);
   * `drop(type, fields)` then asks the Sprite to let go of the transfer (its slot freed at once, not at the
   * idle sweep's two minutes), and gives back a promise settled once that is answered (never, if the
   * sign-in ends first: race it with `aborted(ended)`). `release()` when the transfer is over. */
  cancellable() {
    const asker = this.asker();
    const cancelling = new AbortController();
    const { signal, release } = either(asker.signal, cancelling.signal);
    return {
      ask: (type, fields) => (cancelling.signal.aborted
        ? Promise.reject(Object.assign(new Error("cancelled"), { code: "cancelled" })) : asker.ask(type, fields)),
      signal,
      ended: asker.signal,
      cancel: () => cancelling.abort(),
      cancelled: () => cancelling.signal.aborted,
      drop: (type, fields) => retried(() => asker.ask(type, fields), () => {}, DROPPED, asker.signal).catch(() => {}),
      release,
    };
  }

  say(text, kind = "ok") {
    this.flash.textContent = text;
    this.flash.dataset.kind = kind;
    this.flash.setAttribute("role", kind === "error" ? "alert" : "status");
  }

  async show(path = this.path) {
    const current = this.listings.begin();
    // The same folder drawn again (an upload): as many of its entries as were shown, the pages the person
    // brought with Show the next too, or the row they were on would be gone, and the focus with it.
    const had = path === this.path ? this.table.querySelectorAll("tbody > tr").length : 0;
    let answer;
    let page = 0; // how many the Sprite lists at a time: its first answer's
    const entries = [];
    try {
      do {
        const last = entries.at(-1);
        answer = await this.conn.request("files_list", last ? { path, after: last.name, after_folder: last.kind === "folder" } : { path });
        if (!current()) return; // a folder opened meanwhile is the one to show
        entries.push(...answer.entries);
        page ||= answer.entries.length;
      } while (answer.rest > 0 && entries.length < had && answer.entries.length);
    } catch (error) {
      if (current()) this.say(error.message, "error");
      return;
    }
    const draw = () => {
      this.path = answer.path;
      this.renderCrumbs();
      const rows = entries.map((entry) => this.row(entry));
      const head = el("tr", {}, el("th", { scope: "col", text: "Name" }), el("th", { scope: "col", text: "Size" }),
        el("th", { scope: "col", text: "Changed" }), el("th", { scope: "col", text: "" }, el("span", { class: "visually-hidden", text: "Actions" })));
      const body = el("tbody", {}, rows);
      clear(this.table).append(el("table", { testid: "file-list" },
        el("caption", { class: "visually-hidden", text: `Files in ${this.path || "your workspace"}` }),
        el("thead", {}, head), body));
      if (!rows.length) this.table.append(el("p", { class: "empty", text: "This folder is empty." }));
      this.pager(body, answer.rest, page, current);
      this.root.dataset.path = this.path;
    };
    // The same folder drawn again (an upload from another device): the focus stays on the row's button.
    if (answer.path === this.path) keepingFocus(this.table, draw, { fallback: "button" });
    else draw();
  }

  /** Under a listing that holds part of a big folder (the Sprite lists 2,000 entries at a time, in the
   * folder's order): how many are shown, and a button for the next ones, put below them. The next page is
   * asked after the last entry shown, not from a count: an entry removed above it meanwhile would shift
   * the next one past a count, never listed. `rest`: how many the Sprite has after those. `current()`:
   * the folder drawn is still the one shown (another opened meanwhile takes no rows of this one's). */
  pager(body, rest, page, current) {
    this.table.querySelector(":scope > .pager")?.remove();
    const shown = body.rows.length;
    if (!(rest > 0) || !shown) return;
    const last = body.rows[shown - 1].dataset;
    const more = async () => {
      let answer;
      try {
        answer = await this.conn.request("files_list", { path: this.path, after: last.name, after_folder: last.kind === "folder" });
      } catch (error) {
        if (current()) this.say(error.message, "error");
        return false;
      }
      if (!current() || !body.isConnected) return false;
      const listed = new Set([...body.rows].map((row) => row.dataset.name)); // one renamed meanwhile: once
      const rows = answer.entries.filter((entry) => !listed.has(entry.name)).map((entry) => this.row(entry));
      body.append(...rows);
      this.pager(body, answer.rest, page, current);
      return rows[0]?.querySelector("button") ?? body; // where the keyboard goes on from (askingOnce)
    };
    this.table.append(el("p", { class: "hint pager", testid: "files-more" }, `Showing ${count(shown)} of ${count(shown + rest)}. `,
      el("button", { type: "button", class: "link", testid: "files-more-button", text: `Show the next ${count(Math.min(rest, page))}`, onclick: askingOnce(more) })));
  }

  renderCrumbs() {
    const parts = this.path ? this.path.split("/") : [];
    const crumb = (label, to) => el("button", { type: "button", class: "link", text: label, onclick: () => this.show(to) });
    clear(this.crumbs).append(crumb("workspace", ""),
      ...parts.flatMap((part, i) => [" / ", i === parts.length - 1
        ? el("span", { "aria-current": "location", dir: "auto", text: shownName(part) })
        : crumb(shownName(part), parts.slice(0, i + 1).join("/"))]));
  }

  row(entry) {
    const path = this.path ? `${this.path}/${entry.name}` : entry.name;
    const openable = entry.openable !== false;  // false: the name is not UTF-8 (shown with U+FFFD)
    const name = entry.kind === "folder" && openable
      ? el("button", { type: "button", class: "link", testid: "open-folder", dir: "auto", text: `${shownName(entry.name)}/`, onclick: () => this.show(path) })
      : el("span", { dir: "auto", text: entry.kind === "folder" ? `${shownName(entry.name)}/` : shownName(entry.name) });
    const action = !openable
      ? el("span", { class: "muted", text: "its name is not UTF-8: rename it to open it here" })
      : entry.kind === "file"
      ? el("button", { type: "button", testid: "download", text: "Download", "aria-label": `Download ${shownName(entry.name)}`, onclick: () => this.download(path, entry.name) })
      : el("span", { class: "muted", text: entry.kind === "link" ? "a link: not followed" : entry.kind === "other" ? "not a file" : "" });
    return el("tr", { testid: "file-entry", dataset: { name: entry.name, kind: entry.kind } },
      el("td", { class: "name" }, name), el("td", { text: entry.kind === "file" ? size(entry.size) : "" }),
      el("td", { text: when(entry.modified) }), el("td", {}, action));
  }

  /** A line in the transfers list: its bar, and `done(kind, text)` to end it. Still going when its
   * sign-in ends (`ended`), the transfer has ended, and its line says so: after a refused token (a new
   * one provisioned: most likely the same person, signing in again) the person learns what to pick
   * again; after Sign out, `signOut()` clears every line just after. */
  transfer(testid, verb, name, total, ended, cancel = null) {
    const bar = el("progress", { max: String(total || 1), value: "0", "aria-label": `${verb} ${name}` });
    const { item, state } = this.line(testid, name, "running", "starting…");
    // `cancel`: the line has a Cancel while the transfer can still be stopped (`settling()` takes it away);
    // clicked, the line says "cancelling…" until `done`, whatever the request on its way answers.
    let cancelling = false;
    // The Cancel gone (pressed, or too late), the keyboard's place stays on its line, not the page's body.
    const noCancel = () => {
      if (stop?.contains(document.activeElement)) item.focus();
      stop?.remove();
    };
    const stop = cancel && el("button", { type: "button", class: "link", testid: "transfer-cancel", text: "Cancel",
      "aria-label": `Cancel ${verb.toLowerCase()} ${name}`, onclick: () => {
        cancelling = true;
        noCancel();
        item.dataset.state = "cancelling";
        state.textContent = "cancelling…";
        cancel();
      } });
    state.before(bar);
    if (stop) state.after(stop);
    const done = (kind, text) => { item.dataset.state = kind; state.textContent = text; bar.remove(); noCancel(); };
    ended.addEventListener("abort", () => {
      if (!bar.isConnected) return;
      const why = ended.reason === "refused" ? "the token was refused" : "signed out";
      done("error", `stopped: ${why}; ${verb === "Uploading" ? "upload" : "download"} it again`);
      this.stopped.push(name);
    }, { once: true });
    return {
      bar,
      step: (done) => {
        if (cancelling) return;
        bar.value = done;
        item.dataset.state = "running";
        state.textContent = `${Math.round((100 * done) / (total || 1))} %`;
      },
      retrying: (attempt) => {
        if (cancelling) return;
        item.dataset.state = "retrying";
        state.textContent = `retrying (${attempt})…`;
      },
      settling: noCancel,
      done,
    };
  }

  /** A line at the top of the transfers list: the name, and what became of it (`kind`: running, retrying,
   * cancelling, done, cancelled, error). */
  line(testid, name, kind, text) {
    const state = el("span", { class: "state", testid: "transfer-state", text });
    const item = el("li", { testid, tabindex: "-1", dataset: { state: kind } }, el("span", { dir: "auto", text: name }), state);
    this.progress.prepend(item);
    return { item, state };
  }

  /** What the sign-in form says of the transfers a refused token stopped (read once), or "". */
  stoppedNote() {
    const names = this.stopped.splice(0);
    if (!names.length) return "";
    const note = `${names.length === 1 ? "A transfer" : `${names.length} transfers`} stopped (${names.join(", ")}): start ${names.length === 1 ? "it" : "them"} again from Files once signed in.`;
    this.say(note, "error"); // and in the Files view, for after the sign-in
    return ` ${note}`;
  }

  /** Downloads one file through the socket, then hands it to the browser. Its line's Cancel stops it
   * before its next chunk, and the Sprite is asked to let go of it (`download_cancel`); once every byte is
   * here, it is no longer offered. Cancelled, it holds its place on the Sprite until that is answered
   * (sent once the chunk on its way is back): a download asked for meanwhile, with the connection's
   * other places taken, was refused busy. It starts once the downloads cancelled before it are let go. */
  async download(path, name) {
    let line = null;
    let start = null;
    const transfer = this.cancellable();
    const { ask, signal } = transfer;
    let over; // (or its sign-in ended, which ends every request of it unanswered)
    const letGo = Promise.race([new Promise((resolve) => { over = resolve; }), aborted(transfer.ended)]);
    const cancel = () => { this.letting.add(letGo); transfer.cancel(); };
    try {
      // It has no line until it starts: the person is told why nothing moves yet (not to click again).
      if (this.letting.size) this.say(`${name} starts once the cancelled download is let go.`);
      await Promise.all(this.letting);
      start = await retried(() => ask("download_start", { path }), () => {}, DROPPED, signal);
      line = this.transfer("download-progress", "Downloading", shownName(name), start.size, transfer.ended, cancel);
      const parts = [];
      for (let offset = 0, eof = false; !eof;) { // an empty file too: its one chunk closes it
        const chunk = await retried(() => ask("download_chunk", { download_id: start.download_id, offset }), line.retrying, RETRYABLE, signal);
        parts.push(unbase64(chunk.data));
        offset += parts[parts.length - 1].length;
        eof = chunk.eof;
        line.step(offset);
      }
      if (transfer.cancelled()) throw new Error("cancelled"); // the last chunk came after the Cancel
      line.settling();
      // Not saved, the sign-in over before its turn came: its line says it stopped, and why.
      if (!await handToBrowser(new Blob(parts, { type: "application/octet-stream" }), start.name, transfer.ended)) return;
      line.done("done", "downloaded");
      this.say(`Downloaded ${name}.`);
    } catch (error) {
      if (transfer.cancelled()) {
        line.done("cancelled", "cancelled");
        this.say(`${name} was not downloaded: you cancelled it.`);
        // Its answer never comes if the sign-in ends first: the finally runs all the same.
        await Promise.race([transfer.drop("download_cancel", { download_id: start.download_id }), aborted(transfer.ended)]);
      } else {
        line?.done("error", error.message);
        this.say(`${name} was not downloaded: ${error.message}`, "error");
      }
    } finally {
      transfer.release();
      this.letting.delete(letGo);
      over();
    }
  }

  /** A drop's files, uploaded; its folders said not to be (drop the files inside them instead): said now,
   * and on a line of each folder's own among the transfers, which the files' statuses do not replace (the
   * first file's "Uploaded …" took the place of what was said, and the folder was forgotten). */
  uploadDropped({ files, folders }) {
    if (folders.length) this.say(`Folders cannot be uploaded (${folders.join(", ")}): drop the files inside them.`, "error");
    for (const folder of folders) this.line("upload", `${folder}/`, "error", "not uploaded: a folder (drop the files inside it)");
    this.uploadAll(files);
  }

  /** One after the other. One whose sign-in ended (Sign out, a refused token) never ends, so the files
   * still to go are never asked for (after a refused token, `stoppedNote()` names them). */
  async uploadAll(files) {
    for (const [index, file] of files.entries()) await this.upload(file, files.slice(index + 1));
  }

  /** Uploads one file, saying how it went (if its sign-in ended, through its line and `stopped`, which
   * names `after` too, the files that were to follow: the call never ends). Its line's Cancel stops it
   * before its next request (a pause between retries cut short), and the Sprite is asked to drop what it
   * has of it (`upload_cancel`); once its finish is asked, it is no longer offered. */
  async upload(file, after = []) {
    const transfer = this.cancellable();
    const { ask, signal } = transfer;
    const line = this.transfer("upload", "Uploading", file.name, file.size, transfer.ended, transfer.cancel);
    // The files queued behind it, named if its sign-in ends while it runs (it then never ends); only
    // while it runs: the signal lasts the whole sign-in.
    const queued = () => this.stopped.push(...after.map((f) => f.name));
    if (after.length) transfer.ended.addEventListener("abort", queued, { once: true });
    let stream = null; // the server run the upload began on: a restart forgets every upload
    let start = null;
    try {
      start = await retried(() => ask("upload_start", { name: file.name, size: file.size }), line.retrying, DROPPED, signal);
      stream = this.conn.stream;
      for (let offset = 0; offset < file.size; offset += start.chunk_bytes) {
        const data = base64(await file.slice(offset, offset + start.chunk_bytes).arrayBuffer());
        const { received } = await retried(() => ask("upload_chunk", { upload_id: start.upload_id, offset, data }), line.retrying, RETRYABLE, signal);
        line.step(received);
      }
      if (transfer.cancelled()) throw new Error("cancelled"); // pressed during the last chunk: no hashing
      const digest = await sha256(file);
      if (!transfer.cancelled()) line.settling(); // its finish asked: too late to cancel it
      const finished = await retried(() => ask("upload_finish", { upload_id: start.upload_id, ...(digest ? { sha256: digest } : {}) }), line.retrying, DROPPED, signal);
      line.done("done", `in ${finished.path}`);
      this.say(`Uploaded ${file.name} to ${finished.path}. The agent hears of it with your next message.`);
    } catch (error) {
      if (error.code === "not_durable") { // in documents/, a step after failed: uploaded, not to be sent again
        line.done("done", "uploaded, not confirmed");
        this.say(`${file.name}: ${error.message}`, "error");
        return;
      }
      const cut = error.code === "not_found" && stream !== null && stream !== this.conn.stream;
      const why = cut ? "the Sprite restarted during the upload, which cut it: pick the file again to upload it." : error.message;
      if (transfer.cancelled()) {
        line.done("cancelled", "cancelled");
        this.say(`${file.name} was not uploaded: you cancelled it.`);
      } else {
        line.done("error", cut ? "cut by a restart" : error.message);
        this.say(`${file.name} was not uploaded: ${why}`, "error");
      }
      // Cancelled, or failed here (the file unreadable, a chunk refused for good): its slot on the Sprite is
      // freed now, not at the idle sweep's two minutes (four such held every upload back).
      if (start && !cut) transfer.drop("upload_cancel", { upload_id: start.upload_id });
    } finally {
      transfer.ended.removeEventListener("abort", queued);
      transfer.release();
    }
  }
}
