// The six memory files: each with its size against its limits, its text, a person's own
// edit (the daemon's four files), and its history as diffs, with rollback to any version.

import { clear, el, keepingFocus, plural, when } from "./dom.js";

export class FilesPanel {
  constructor(root, connection, flash) {
    this.root = root;
    this.conn = connection;
    this.flash = flash;
    this.selected = "user.md";
    this.current = null; // the open file's answer: {file, text, history}
    this.editing = null; // the name of the file whose editor is open, with the person's draft in it
    this.list = el("ul", { class: "file-list" });
    this.detail = el("div", { class: "file-detail" });
    root.append(el("div", { class: "files-layout" }, this.list, this.detail));
  }

  async load() {
    const { files } = await this.conn.request("memory_files");
    keepingFocus(this.list, () => clear(this.list).append(...files.map((f) => this.fileItem(f))));
    await this.open(this.selected);
  }

  fileItem(f) {
    const share = Math.min(1, f.lines / f.max_lines);
    const fill = el("span");
    fill.style.width = `${Math.round(share * 100)}%`; // through CSSOM: the CSP forbids style attributes
    return el("li", { testid: "memory-file", dataset: { name: f.name, owner: f.owner } },
      el("button", { type: "button", class: f.name === this.selected ? "selected" : "", "aria-pressed": String(f.name === this.selected),
        onclick: () => this.open(f.name, true) },
        el("span", { class: "name", text: f.name }),
        el("span", { class: "badge", text: f.owner === "daemon" ? "curated" : "deploy" }),
        el("span", { class: "lines", testid: "file-lines", text: `${f.lines} / ${f.max_lines} lines` }),
        el("span", { class: `meter${share > 0.9 ? " full" : ""}` }, fill),
        el("span", { class: "versions", text: plural(f.versions, "version") })));
  }

  async open(name, chosen = false) {
    this.selected = name;
    for (const button of this.list.querySelectorAll("button")) {
      const selected = button.closest("li").dataset.name === name;
      button.classList.toggle("selected", selected);
      button.setAttribute("aria-pressed", String(selected));
    }
    const answer = await this.conn.request("memory_file", { name });
    // A reload (the tab shown again, Refresh, a save elsewhere) must not throw away a draft: the
    // editor stays on the text it began from, and the save tells the person if the file moved on.
    if (this.editing === name) {
      if (answer.file.sha256 !== this.current.file.sha256) {
        this.flash(`${name} changed since you began editing: your draft is kept, but saving it will be refused. Copy it, then Cancel to see the new text.`, "error");
      }
      return;
    }
    this.current = answer;
    keepingFocus(this.detail, () => this.renderFile());
    // On a phone the file opens below the list: bring it into view.
    if (chosen && window.matchMedia("(max-width: 760px)").matches) this.detail.scrollIntoView({ block: "start" });
  }

  renderFile(editing = false) {
    const { file, text, history } = this.current;
    this.editing = editing ? file.name : null;
    const header = el("header", { class: "detail-head" },
      el("h2", { text: file.name }),
      el("span", { class: "facts", text: `${file.lines} / ${file.max_lines} lines · ${file.bytes.toLocaleString("en-US")} / ${file.max_bytes.toLocaleString("en-US")} bytes` }),
      file.editable && !editing ? el("button", { type: "button", testid: "file-edit", onclick: () => this.renderFile(true), text: "Edit" }) : null);
    const body = editing ? this.editor(file, text)
      : el("pre", { class: "file-text", testid: "file-text", dir: "auto", tabindex: "0", "aria-label": `Text of ${file.name}`,
        text: text || "(empty: the boot prompt shows a default)" });
    this.latest = history.length ? history[history.length - 1].number : null;
    const versions = el("ol", { class: "versions", reversed: true, "aria-label": `Versions of ${file.name}` },
      [...history].reverse().map((v) => el("li", { testid: "file-version", dataset: { number: v.number } },
        el("button", { type: "button", onclick: () => this.showVersion(v.number) },
          el("strong", { text: `#${v.number}` }), ` ${when(v.created_at)} · `,
          el("span", { class: `source source-${v.source.split("-")[0]}`, text: v.source }), ` · ${plural(v.lines, "line")}`,
          v.number === this.latest ? el("span", { class: "badge", text: "current" }) : null))));
    this.versionView = el("div", { class: "version-view" });
    const note = file.editable
      ? "Curated by the memory daemon. Your edit is kept as a version and the daemon builds on it; it never overwrites an edit it did not see."
      : "Written by deploys: a new release replaces it (your rollbacks stay in its history).";
    clear(this.detail).append(header, el("p", { class: "hint", text: note }), body,
      el("h3", { text: `History (${plural(file.versions, "version")})` }), versions, this.versionView);
  }

  editor(file, text) {
    const area = el("textarea", { class: "file-editor", testid: "file-editor", spellcheck: "false", rows: 16, dir: "auto",
      "aria-label": `Your edit of ${file.name}` });
    area.value = text;
    const counter = el("span", { class: "counter" });
    const save = el("button", { type: "button", class: "primary", testid: "file-save", text: "Save as my edit" });
    const recount = () => {
      const lines = area.value ? area.value.split("\n").length - (area.value.endsWith("\n") ? 1 : 0) : 0;
      counter.textContent = `${lines} / ${file.max_lines} lines`;
      counter.classList.toggle("over", lines > file.max_lines);
      save.disabled = area.value === text || lines > file.max_lines;
    };
    area.addEventListener("input", recount);
    save.addEventListener("click", () => this.save(file, area.value));
    recount();
    return el("div", { class: "editing" }, area,
      el("div", { class: "actions" }, counter, save,
        el("button", { type: "button", testid: "file-cancel", onclick: () => this.cancel(file.name), text: "Cancel" })));
  }

  async cancel(name) {
    this.editing = null;
    await this.open(name); // the file as it is now: it may have moved on during the edit
  }

  async save(file, text) {
    try {
      const { version } = await this.conn.request("memory_edit", { name: file.name, text, base_sha256: file.sha256 });
      this.flash(`Saved ${file.name} as version ${version.number} (your edit).`);
      this.editing = null;
      await this.load();
    } catch (error) {
      this.flash(error.message, "error");
    }
  }

  async showVersion(number) {
    const v = await this.conn.request("memory_version", { name: this.selected, number });
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
        text: `Make version ${number} current again`, onclick: () => this.rollback(number) });
    clear(this.versionView).append(
      el("h3", { text: `Version ${number}${current ? " (current)" : ""}: ${v.version.source}, ${when(v.version.created_at)}` }),
      el("p", { class: "hint", text: v.previous ? `Changes since version ${v.previous}:` : "The first version:" }),
      el("pre", { class: "diff", testid: "file-diff", dir: "auto", tabindex: "0", "aria-label": `Changes in version ${number}` }, lines.map((line) => el("span", { class: diffClass(line), text: `${line}\n` }))),
      rollback);
    this.versionView.scrollIntoView({ block: "nearest" });
  }

  async rollback(number) {
    try {
      const { version } = await this.conn.request("memory_rollback", { name: this.selected, number });
      this.flash(`${this.selected} is version ${number}'s text again (saved as version ${version.number}).`);
      this.editing = null; // the person chose this text over any draft
      await this.load();
    } catch (error) {
      this.flash(error.message, "error");
    }
  }
}

function diffClass(line) {
  if (line.startsWith("+++") || line.startsWith("---")) return "file";
  if (line.startsWith("@@")) return "hunk";
  if (line.startsWith("+")) return "add";
  if (line.startsWith("-")) return "del";
  return "ctx";
}
