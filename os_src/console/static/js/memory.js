// The memory tab: files, learnings, the daemon's health and the next boot prompt, each
// loaded over the WebSocket when it is opened.

import { el } from "./dom.js";
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
    this.nav = el("nav", { class: "subtabs" });
    this.panels = new Map();
    const body = el("div", { class: "memory-body" });
    for (const [key, label, Panel] of SECTIONS) {
      const section = el("section", { class: "panel", testid: `memory-panel-${key}`, hidden: true });
      this.panels.set(key, { section, panel: new Panel(section, connection, (text, kind) => this.flash(text, kind)) });
      this.nav.append(el("button", { type: "button", testid: `memory-section-${key}`, dataset: { section: key }, text: label,
        onclick: () => this.show(key) }));
      body.append(section);
    }
    this.nav.append(el("button", { type: "button", class: "refresh", text: "Refresh", onclick: () => this.show(this.current) }));
    root.append(this.nav, this.flashBox, body);
    this.current = "files";
  }

  async show(key = this.current) {
    this.flash("");
    this.current = key;
    for (const [name, { section }] of this.panels) section.hidden = name !== key;
    for (const button of this.nav.querySelectorAll("[data-section]")) button.classList.toggle("selected", button.dataset.section === key);
    const { section, panel } = this.panels.get(key);
    section.dataset.loading = "true";
    try {
      await panel.load();
    } catch (error) {
      this.flash(error.message, "error");
    } finally {
      delete section.dataset.loading;
    }
  }

  flash(text, kind = "ok") {
    this.flashBox.textContent = text;
    this.flashBox.dataset.kind = kind;
  }
}
