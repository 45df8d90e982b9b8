// The six memory files: each with its size against its limits, its text, a person's own
// edit (the daemon's four files), and its history as diffs, with rollback to any version.

import { told } from "./connection.js";
import { clear, el, keepingFocus, plural, when } from "./dom.js";

// What text.safe_text drops from a memory file (C0 controls but tab and newline; the textarea has no CR).
const UNSAFE = /[\u0000-\u0008\u000b-\u001f]/g;

/** A draft as the server stores it: text.safe_text drops control characters, then a final newline is added. */
function stored(draft) {
  const text = draft.replace(UNSAFE, "");
  return text && !text.endsWith("\n") ? `${text}\n` : text;
}

export class FilesPanel {
  constructor(root, connection, flash) {
    this.root = root;
    this.conn = connection;
    this.flash = flash;
    this.selected = "user.md";
    this.current = null; // the open file's answer: {file, text, history}
    this.editing = null; // the name of the file whose editor is open, with the person's draft in it
    this.area = null; // that editor
    // Files left mid-edit: name -> {answer: the file's answer the edit began from (its sha256 is the save's
    // base), area: its editor}. The editor, not its text: it stays on screen, and typed in, until the
    // other file's answer comes.
    this.drafts = new Map();
    this.list = el("ul", { class: "file-list" });
    this.detail = el("div", { class: "file-detail" });
    root.append(el("div", { class: "files-layout" }, this.list, this.detail));
  }

  async load(current = () => true) {
    const { files } = await this.conn.request("memory_files");
    if (!current()) return; // a newer load of the section is the one shown
    keepingFocus(this.list, () => clear(this.list).append(...files.map((f) => this.fileItem(f))));
    await this.open(this.selected);
  }

  fileItem(f) {
    const share = Math.min(1, f.lines / f.max_lines);
    const fill = el("span");
    fill.style.width = `${Math.round(share * 100)}%`; // through CSSOM: the CSP forbids style attributes
    return el("li", { testid: "memory-file", dataset: { name: f.name, owner: f.owner } },
      el("button", { type: "button", class: f.name === this.selected ? "selected" : "", "aria-pressed": String(f.name === this.selected),
        onclick: () => told(this.open(f.name, true), this.flash) },
        el("span", { class: "name", text: f.name }),
        el("span", { class: "badge", text: f.owner === "daemon" ? "curated" : "deploy" }),
        el("span", { class: "lines", testid: "file-lines", text: `${f.lines} / ${f.max_lines} lines` }),
        el("span", { class: `meter${share > 0.9 ? " full" : ""}` }, fill),
        el("span", { class: "versions", text: plural(f.versions, "version") })));
  }

  /** Shows file `name`; `changed`: what to say if it changed during the edit (a refused Save's words). */
  async open(name, chosen = false, changed = null) {
    // Looking at another file mid-edit (to copy a line from it) keeps the draft for when they come back.
    if (this.editing && this.editing !== name) this.drafts.set(this.editing, { answer: this.current, area: this.area });
    if (this.editing !== name) this.editing = null;
    this.selected = name;
    for (const button of this.list.querySelectorAll("button")) {
      const selected = button.closest("li").dataset.name === name;
      button.classList.toggle("selected", selected);
      button.setAttribute("aria-pressed", String(selected));
    }
    const answer = await this.conn.request("memory_file", { name });
    if (this.selected !== name) return; // another file was chosen meanwhile: its answer is the one to show
    // A reload (the tab shown again, Refresh, a save elsewhere) or a return to a file left mid-edit must
    // not throw away a draft: the editor stays on the text it began from, and the save is refused (and
    // the person told now) if the file moved on.
    const kept = this.drafts.get(name);
    if (kept) {
      this.drafts.delete(name);
      this.current = kept.answer;
      this.renderFile(true, kept.area.value); // typed up to the moment the file was left
    }
    if (this.editing === name) {
      if (answer.file.sha256 === this.current.file.sha256) return;
      if (answer.text !== stored(this.area.value)) {
        this.flash(changed ?? `${name} changed since you began editing: your draft is kept, but saving it will be refused. Copy it, then Cancel to see the new text.`, "error");
        return;
      }
      // It changed to the draft itself: a Save whose answer was lost (the link dropped, a token refused).
      this.editing = null;
      this.flash(`${name} already holds your draft: it was saved.`);
    }
    this.current = answer;
    this.renderFile();
    // On a phone the file opens below the list: bring it into view.
    if (chosen && window.matchMedia("(max-width: 760px)").matches) this.detail.scrollIntoView({ block: "start" });
  }

  renderFile(editing = false, draft = undefined) {
    const { file, text, history } = this.current;
    this.editing = editing ? file.name : null;
    const header = el("header", { class: "detail-head" },
      el("h2", { text: file.name }),
      el("span", { class: "facts", text: `${file.lines} / ${file.max_lines} lines · ${file.bytes.toLocaleString("en-US")} / ${file.max_bytes.toLocaleString("en-US")} bytes` }),
      file.editable && !editing ? el("button", { type: "button", testid: "file-edit", onclick: () => this.renderFile(true), text: "Edit" }) : null);
    const body = editing ? this.editor(file, text, draft ?? text)
      : el("pre", { class: "file-text", testid: "file-text", dir: "auto", tabindex: "0", "aria-label": `Text of ${file.name}`,
        text: text || "(empty: the boot prompt shows a default)" });
    this.latest = history.length ? history[history.length - 1].number : null;
    const versions = el("ol", { class: "versions", reversed: true, "aria-label": `Versions of ${file.name}` },
      [...history].reverse().map((v) => el("li", { testid: "file-version", dataset: { number: v.number } },
        el("button", { type: "button", onclick: () => told(this.showVersion(v.number), this.flash) },
          el("strong", { text: `#${v.number}` }), ` ${when(v.created_at)} · `,
          el("span", { class: `source source-${v.source.split("-")[0]}`, text: v.source }), ` · ${plural(v.lines, "line")}`,
          v.number === this.latest ? el("span", { class: "badge", text: "current" }) : null))));
    this.versionView = el("div", { class: "version-view" });
    const note = file.editable
      ? "Curated by the memory daemon. Your edit is kept as a version and the daemon builds on it; it never overwrites an edit it did not see."
      : "Written by deploys: a new release replaces it (your rollbacks stay in its history).";
    // The keyboard's place, never <body>: the control it was on (a version), else into the editor on
    // Edit, back on Edit when it closes (from Cancel, Save or a rollback), or a deploy's file: its text.
    keepingFocus(this.detail, () => clear(this.detail).append(header, el("p", { class: "hint", text: note }), body,
      el("h3", { text: `History (${plural(file.versions, "version")})` }), versions, this.versionView),
    { fallback: editing ? "[data-testid=file-editor]" : "[data-testid=file-edit], [data-testid=file-text]" });
    if (editing && draft === undefined) this.area.focus(); // Edit pressed: the keyboard goes into the editor
  }

  editor(file, text, draft) {
    const area = el("textarea", { class: "file-editor", testid: "file-editor", spellcheck: "false", rows: 16, dir: "auto",
      "aria-label": `Your edit of ${file.name}` });
    area.value = draft;
    this.area = area;
    const counter = el("span", { class: "counter", testid: "file-counter", id: "file-counter" });
    const save = el("button", { type: "button", class: "primary", testid: "file-save", text: "Save as my edit",
      "aria-describedby": "file-counter" }); // a screen reader on a Save that is off hears why
    const recount = () => {
      const lines = area.value ? area.value.split("\n").length - (area.value.endsWith("\n") ? 1 : 0) : 0;
      // Bytes as the server will store the draft (text.safe_text drops control characters, then a final
      // newline is added): a draft of exactly the limit without one is a byte over, and refused.
      const bytes = new TextEncoder().encode(stored(area.value)).length;
      // Why Save is off, in words (as the server would refuse it): what to cut, not only a red number.
      const over = lines > file.max_lines ? `over the limit: remove ${plural(lines - file.max_lines, "line")} to save`
        : bytes > file.max_bytes ? `${bytes.toLocaleString("en-US")} / ${file.max_bytes.toLocaleString("en-US")} bytes, over the limit: shorten it by ${plural(bytes - file.max_bytes, "byte")} to save`
          : "";
      counter.textContent = `${lines} / ${file.max_lines} lines${over ? `, ${over}` : ""}`;
      counter.classList.toggle("over", Boolean(over));
      save.disabled = area.value === text || Boolean(over);
    };
    area.addEventListener("input", recount);
    save.addEventListener("click", async () => {
      // One request at a time: a second Save of the same draft began from the same text, and would be
      // refused as if someone else had saved (it was this one). Not by disabling the button: that
      // would drop the keyboard's place to <body>.
      if (save.getAttribute("aria-busy") === "true") return;
      save.setAttribute("aria-busy", "true");
      try { await this.save(file, area.value); } finally { save.removeAttribute("aria-busy"); }
    });
    recount();
    return el("div", { class: "editing" }, area,
      el("div", { class: "actions" }, counter, save,
        el("button", { type: "button", testid: "file-cancel", onclick: () => told(this.cancel(file.name), this.flash), text: "Cancel" })));
  }

  /** Sign out: nothing of the person who left stays for the next one to sign in on the page, above all
   * not a draft (shown again by the next `open`, and saved by their Save). */
  signOut() {
    Object.assign(this, { selected: "user.md", current: null, editing: null, area: null, latest: null, versionView: null });
    this.drafts.clear();
    clear(this.list);
    clear(this.detail);
  }

  async cancel(name) {
    this.editing = null;
    this.drafts.delete(name);
    await this.open(name); // the file as it is now: it may have moved on during the edit
  }

  async save(file, text) {
    try {
      const { version } = await this.conn.request("memory_edit", { name: file.name, text, base_sha256: file.sha256 });
      this.flash(`Saved ${file.name} as version ${version.number} (your edit).`);
      this.drafts.delete(file.name);
      if (this.editing === file.name) this.editing = null;
      await this.load();
    } catch (error) {
      this.flash(error.message, "error");
      if (error.code === "not_durable") { // saved, the disk's confirmation failed: the draft is the file now
        this.drafts.delete(file.name);
        if (this.editing === file.name) this.editing = null;
        await this.load();
        return;
      }
      // Refused as changed, maybe by this very draft: a Save before it written, its answer lost (`open` says which).
      if (error.code === "file_changed" && this.editing === file.name) await told(this.open(file.name, false, error.message), this.flash);
    }
  }

  async showVersion(number) {
    // The file and the view it was asked from: another file shown before the answer came must not get
    // this one's diff, nor a rollback button that would act on it.
    const { name } = this.current.file;
    const view = this.versionView;
    const v = await this.conn.request("memory_version", { name, number });
    if (!view.isConnected) return;
    const lines = v.diff ? v.diff.split("\n") : ["(no change from the version before)"];
    for (const item of this.detail.querySelectorAll("[data-testid=file-version]")) {
      const shown = item.dataset.number === String(number);
      item.classList.toggle("shown", shown);
      if (shown) item.querySelector("button").setAttribute("aria-current", "true");
      else item.querySelector("button").removeAttribute("aria-current");
    }
    const current = number === this.latest;
    const rollback = current
      ? el("p", { class: "hint", testid: "file-is-current", text: `Version ${number} is the current text.` })
      : el("button", { type: "button", testid: "file-rollback", dataset: { number },
        text: `Make version ${number} current again`, onclick: () => this.rollback(name, number) });
    clear(view).append(
      el("h3", { text: `Version ${number}${current ? " (current)" : ""}: ${v.version.source}, ${when(v.version.created_at)}` }),
      el("p", { class: "hint", text: v.previous ? `Changes since version ${v.previous}:` : "The first version:" }),
      el("pre", { class: "diff", testid: "file-diff", dir: "auto", tabindex: "0", "aria-label": `Changes in version ${number}` }, lines.map((line) => el("span", { class: diffClass(line), text: `${line}\n` }))),
      rollback);
    view.scrollIntoView({ block: "nearest" });
  }

  async rollback(name, number) {
    try {
      const { version } = await this.conn.request("memory_rollback", { name, number });
      this.flash(`${name} is version ${number}'s text again (saved as version ${version.number}).`);
    } catch (error) {
      this.flash(error.message, "error");
      if (error.code !== "not_durable") return; // not_durable: done, the disk's confirmation failed
    }
    if (this.editing === name) this.editing = null; // the person chose this text over any draft
    this.drafts.delete(name);
    await this.load();
  }
}

function diffClass(line) {
  if (line.startsWith("+++") || line.startsWith("---")) return "file";
  if (line.startsWith("@@")) return "hunk";
  if (line.startsWith("+")) return "add";
  if (line.startsWith("-")) return "del";
  return "ctx";
}
