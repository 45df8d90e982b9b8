// The canvas: the cards the agent keeps beside the conversation. `ready` carries every
// open card (so a reload shows them again); card_created / card_updated / card_closed
// keep the view current, applied as upsert and remove by card id.

import { clear, el, when } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

export class CanvasView {
  constructor(root, counter) {
    this.root = root;
    this.counter = counter;
    this.cards = new Map(); // id -> {card, node}
  }

  handle(frame) {
    switch (frame.type) {
      case "ready": return this.reset(frame.cards);
      case "card_created":
      case "card_updated": return this.upsert(frame.card, true);
      case "card_closed": return this.close(frame.card_id);
      default: return undefined;
    }
  }

  reset(cards) {
    this.cards.clear();
    clear(this.root);
    for (const card of cards) this.upsert(card, false);
    this.update();
  }

  upsert(card, live) {
    const node = this.render(card);
    if (live) node.classList.add("fresh");
    const known = this.cards.get(card.id);
    if (known) known.node.replaceWith(node);
    this.cards.set(card.id, { card, node });
    this.update();
  }

  close(id) {
    const known = this.cards.get(id);
    if (!known) return;
    known.node.remove();
    this.cards.delete(id);
    this.update();
  }

  /** Newest change first; the DOM order follows. */
  update() {
    const sorted = [...this.cards.values()].sort((a, b) => b.card.updated_at - a.card.updated_at);
    this.root.querySelector(":scope > .empty")?.remove();
    this.root.append(...sorted.map((entry) => entry.node));
    if (!sorted.length) this.root.append(el("p", { class: "empty", text: "No cards yet. The agent puts things here for you to keep an eye on: ask it for a list, a summary or a plan." }));
    this.counter.textContent = sorted.length ? String(sorted.length) : "";
  }

  render(card) {
    return el("article", { class: `card kind-${card.kind}`, testid: "card", dataset: { cardId: card.id, kind: card.kind } },
      el("header", {},
        el("h3", { class: "title", text: card.title }),
        el("span", { class: "badge", text: card.kind })),
      el("div", { class: "body markdown" }, renderMarkdown(card.body)),
      el("footer", { text: `updated ${when(card.updated_at)}` }));
  }
}
