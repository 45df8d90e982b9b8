// The canvas: the cards the agent keeps beside the conversation. `ready` carries every
// open card (so a reload shows them again); card_created / card_updated / card_closed
// keep the view current, applied as upsert and remove by card id. The person can open a
// card large, copy it, and close it (every device sees it close).

import { clear, el, keepingFocus, when } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

export class CanvasView {
  constructor(root, counter, connection, onError) {
    Object.assign(this, { root, counter, conn: connection, onError });
    this.cards = new Map(); // id -> {card, node}
    this.dialog = el("dialog", { class: "card-dialog", testid: "card-dialog", "aria-labelledby": "card-dialog-title" });
    this.dialog.addEventListener("click", (event) => { if (event.target === this.dialog) this.dialog.close(); });
    document.body.append(this.dialog);
  }

  handle(frame) {
    switch (frame.type) {
      case "ready": return this.reset(frame.cards);
      case "card_created":
      case "card_updated": return this.upsert(frame.card, true);
      case "card_closed": return this.remove(frame.card_id);
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
    // Drawn again under the person's focus: it stays on the same button.
    keepingFocus(this.root, () => {
      this.cards.get(card.id)?.node.replaceWith(node);
      this.cards.set(card.id, { card, node });
      this.update();
    }, { fallback: "button" });
    if (this.dialog.open && this.dialog.dataset.cardId === card.id) this.expand(card);
  }

  remove(id) {
    const known = this.cards.get(id);
    if (!known) return;
    // Open large, the card's view closes with it: the focus it had would stay in the closed view (or go
    // back to the card's Open, gone), so it goes to the canvas as from the card itself.
    const inView = this.dialog.open && this.dialog.dataset.cardId === id;
    const hadFocus = known.node.contains(document.activeElement) || (inView && this.dialog.contains(document.activeElement));
    // Where the person was in the canvas: the card after this one, or the one before it when it was the last.
    const near = [known.node.nextElementSibling, known.node.previousElementSibling].find((node) => node?.dataset.cardId);
    known.node.remove();
    this.cards.delete(id);
    this.update();
    if (inView) this.dialog.close();
    // To the next card (not the first: a keyboard user would start again from the top); with none left,
    // the message box, or the Canvas tab when the chat is not shown (the Canvas view, on a phone or on its
    // own): the hidden box took no focus, and it fell to the page's body.
    if (hadFocus) {
      const card = near?.isConnected ? near.querySelector("button") : this.root.querySelector("button");
      for (const next of [card, document.getElementById("composer"), document.getElementById("tab-canvas")]) {
        next?.focus();
        if (next && document.activeElement === next) break;
      }
    }
  }

  /** Newest change first; the DOM order follows, moving only the cards out of place (a card moved
   * in the DOM loses the focus: the one a person is on stays put while another rises past it). */
  update() {
    const sorted = [...this.cards.values()].sort((a, b) => b.card.updated_at - a.card.updated_at);
    this.root.querySelector(":scope > .empty")?.remove();
    let next = this.root.firstElementChild;
    for (const { node } of sorted) {
      if (node === next) next = node.nextElementSibling;
      else this.root.insertBefore(node, next);
    }
    if (!sorted.length) this.root.append(el("p", { class: "empty", text: "No cards yet. The agent puts things here for you to keep an eye on: ask it for a list, a summary or a plan." }));
    this.counter.textContent = sorted.length ? String(sorted.length) : "";
  }

  render(card) {
    const titleId = `card-title-${card.id}`;
    const action = (label, testid, onclick) => el("button", { type: "button", class: "card-action", testid,
      "aria-label": `${label}: ${card.title}`, title: `${label} this card`, onclick, text: label });
    return el("article", { class: `card kind-${card.kind}`, testid: "card", "aria-labelledby": titleId, dataset: { cardId: card.id, kind: card.kind } },
      el("header", {},
        el("h3", { class: "title", id: titleId, dir: "auto", text: card.title }),
        el("span", { class: "badge", text: card.kind }),
        el("span", { class: "card-actions" },
          action("Open", "card-expand", () => this.expand(card)),
          action("Copy", "card-copy", (event) => this.copy(card, event.currentTarget)),
          action("Close", "card-close", () => this.close(card)))),
      el("div", { class: "body markdown", dir: "auto" }, renderMarkdown(card.body)),
      el("footer", { text: `updated ${when(card.updated_at)}` }));
  }

  expand(card) {
    // Drawn again while open (the agent updated the card): the focus and the reader's place stay.
    const scrolled = this.dialog.scrollTop;
    keepingFocus(this.dialog, () => {
      clear(this.dialog).append(
        el("header", {},
          el("h2", { id: "card-dialog-title", dir: "auto", text: card.title }),
          el("span", { class: "badge", text: card.kind }),
          el("button", { type: "button", testid: "card-dialog-close", text: "Close view", onclick: () => this.dialog.close() })),
        el("div", { class: "body markdown", dir: "auto" }, renderMarkdown(card.body)));
      this.dialog.dataset.cardId = card.id;
      if (!this.dialog.open) this.dialog.showModal();
      else this.dialog.scrollTop = scrolled;
    }, { fallback: "button" });
  }

  /** Closes the card opened large, if one is (the sign-in form comes back: a token refused). */
  closeView() {
    if (this.dialog.open) this.dialog.close();
  }

  async copy(card, button) {
    const text = card.body ? `${card.title}\n\n${card.body}` : card.title;
    let copied = false;
    try {
      await navigator.clipboard.writeText(text);
      copied = true;
    } catch {
      copied = copyByHand(text); // no clipboard API on a plain-http address other than localhost
    }
    button.dataset.copied = String(copied);
    button.textContent = copied ? "Copied" : "Copy failed";
    button.setAttribute("aria-label", copied ? `Copied: ${card.title}` : `Copy failed: ${card.title}`);
    button.title = copied ? "Copied to the clipboard" : "Copy failed: select the text instead";
    setTimeout(() => { button.textContent = "Copy"; button.setAttribute("aria-label", `Copy: ${card.title}`); }, 3000);
  }

  async close(card) {
    try {
      await this.conn.request("card_close", { card_id: card.id });
    } catch (error) {
      this.onError(`The card "${card.title}" was not closed: ${error.message}`);
    }
  }
}

function copyByHand(text) {
  const area = el("textarea", { class: "visually-hidden", "aria-hidden": "true", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  let done = false;
  try {
    done = document.execCommand("copy");
  } catch {
    done = false;
  }
  area.remove();
  return done;
}
