// The memory tab: files, learnings, the daemon's health and the next boot prompt, each
// loaded over the WebSocket when it is opened (Health then keeps itself current while shown).

import { el, newest } from "./dom.js";
import { FilesPanel } from "./memory_files.js";
import { LearningsPanel } from "./memory_learnings.js";
import { BootPromptPanel, HealthPanel } from "./memory_status.js";

const SECTIONS = [
  ["files", "Files", FilesPanel],
  ["learnings", "Learnings", LearningsPanel],
  ["health", "Health", HealthPanel],
  ["boot", "Boot prompt", BootPromptPanel],
];

export class MemoryView {
  constructor(root, connection) {
    this.flashBox = el("div", { class: "flash", testid: "memory-flash", role: "status" });
    this.nav = el("div", { class: "subtabs", role: "tablist", "aria-label": "Memory" });
    this.panels = new Map();
    const body = el("div", { class: "memory-body" });
    for (const [key, label, Panel] of SECTIONS) {
      const section = el("section", { class: "panel", testid: `memory-panel-${key}`, hidden: true, role: "tabpanel",
        id: `memory-panel-${key}`, "aria-labelledby": `memory-tab-${key}` });
      // what a panel says of its own work (a search's failure), said while it is the section shown
      const say = (text, kind) => { if (this.shown(key)) this.flash(text, kind); };
      // a load a panel starts itself (Learnings' Search): one of the section's loads, as Refresh's is
      const reload = () => this.load(key);
      this.panels.set(key, { section, panel: new Panel(section, connection, say, reload), loads: newest() });
      this.nav.append(el("button", { type: "button", role: "tab", id: `memory-tab-${key}`, "aria-controls": `memory-panel-${key}`,
        testid: `memory-section-${key}`, dataset: { section: key }, text: label, onclick: () => this.show(key) }));
      body.append(section);
    }
    const tabs = [...this.nav.querySelectorAll("[role=tab]")];
    this.nav.addEventListener("keydown", (event) => {
      const at = tabs.indexOf(document.activeElement);
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (at < 0 || !step) return;
      event.preventDefault();
      const next = tabs[(at + step + tabs.length) % tabs.length];
      next.focus();
      this.show(next.dataset.section);
    });
    const refresh = el("button", { type: "button", class: "refresh", testid: "memory-refresh", text: "Refresh", onclick: () => this.show(this.current) });
    root.append(el("div", { class: "subtabs-bar" }, this.nav, refresh), this.flashBox, body);
    this.current = "files";
  }

  async show(key = this.current) {
    this.flash("");
    this.current = key;
    for (const [name, { section }] of this.panels) section.hidden = name !== key;
    for (const button of this.nav.querySelectorAll("[data-section]")) {
      const selected = button.dataset.section === key;
      button.setAttribute("aria-selected", String(selected));
      button.tabIndex = selected ? 0 : -1;
    }
    await this.load(key);
  }

  /** Loads section `key` (shown, Refresh, or a Search of its own). The newest load of a section is the one
   * shown, whenever the others end (Refresh clicked twice, or a Search then Refresh, the first answer slow):
   * a panel draws only while `current()`, and only the newest load's failure is said. data-loading says a
   * load of the section is on its way: the last one, not the first to end. */
  async load(key) {
    const { section, panel, loads } = this.panels.get(key);
    const current = loads.begin();
    section.dataset.loading = "true";
    try {
      await panel.load(current);
    } catch (error) {
      if (current() && this.shown(key)) this.flash(error.message, "error");
    } finally {
      if (current()) delete section.dataset.loading;
    }
  }

  /** Sign out: every section as a fresh page has it (empty, the person's drafts and searches gone, none
   * loading: a load Sign out ended never settles, so its `finally` never says it ended), and Files the one
   * shown first. */
  signOut() {
    this.flash("");
    this.current = "files";
    for (const { section, panel, loads } of this.panels.values()) {
      loads.forget();
      section.hidden = true;
      delete section.dataset.loading;
      panel.signOut();
    }
  }

  /** Is `key` the section shown? What is said of another goes unsaid (the view has one notice). */
  shown(key) {
    return this.current === key;
  }

  flash(text, kind = "ok") {
    this.flashBox.textContent = text;
    this.flashBox.dataset.kind = kind;
  }
}
