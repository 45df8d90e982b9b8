// A safe subset of markdown, rendered straight to DOM nodes: headings, paragraphs, lists
// (with task boxes), block quotes, fenced code, tables, rules; inline code, bold, italic,
// and links whose address is http(s) or mailto. Text only ever enters as text nodes, so
// markup in a model's reply or a card body is shown, never run.

import { el } from "./dom.js";

const FENCE = /^\s*(```|~~~)/;
const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;
const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i += 1; continue; }
    const block = [fence, heading, rule, table, list, quote, paragraph]
      .map((reader) => reader(lines, i)).find(Boolean);
    out.append(block.node);
    i = block.next;
  }
  return out;
}

function fence(lines, i) {
  const open = lines[i].match(FENCE);
  if (!open) return null;
  let end = i + 1;
  while (end < lines.length && !lines[end].trim().startsWith(open[1])) end += 1;
  const code = lines.slice(i + 1, end).join("\n");
  return { node: el("pre", {}, el("code", { text: code })), next: end + 1 };
}

function heading(lines, i) {
  const m = lines[i].match(HEADING);
  if (!m) return null;
  const level = Math.min(6, m[1].length + 2); // a card's title is the h3 above its body
  return { node: inline(el(`h${level}`), m[2]), next: i + 1 };
}

function rule(lines, i) {
  return RULE.test(lines[i]) ? { node: el("hr"), next: i + 1 } : null;
}

function cells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function table(lines, i) {
  if (!lines[i].includes("|") || i + 1 >= lines.length || !TABLE_RULE.test(lines[i + 1])) return null;
  const head = el("tr", {}, cells(lines[i]).map((c) => inline(el("th"), c)));
  const body = el("tbody");
  let next = i + 2;
  while (next < lines.length && lines[next].includes("|") && lines[next].trim()) {
    body.append(el("tr", {}, cells(lines[next]).map((c) => inline(el("td"), c))));
    next += 1;
  }
  return { node: el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), body)), next };
}

function list(lines, i) {
  const first = lines[i].match(ITEM);
  if (!first) return null;
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  let next = i;
  while (next < lines.length) {
    const m = lines[next].match(ITEM);
    if (m && /\d/.test(m[2]) !== ordered) break;
    if (!m) { // a continuation line joins the item above; a blank line or other block ends the list
      if (!lines[next].trim() || !/^\s{2,}/.test(lines[next])) break;
      inline(node.lastChild, " " + lines[next].trim());
      next += 1;
      continue;
    }
    node.append(item(m[3], m[1].length));
    next += 1;
  }
  return { node, next };
}

function item(text, indent) {
  const li = el("li", indent >= 2 ? { class: "nested" } : {});
  const task = text.match(/^\[([ xX])\]\s+(.*)$/);
  if (task) {
    li.classList.add("task");
    li.append(el("span", { class: "box", "aria-hidden": "true", text: task[1] === " " ? "☐ " : "☑ " }));
    return inline(li, task[2]);
  }
  return inline(li, text);
}

function quote(lines, i) {
  if (!QUOTE.test(lines[i])) return null;
  const inner = [];
  let next = i;
  while (next < lines.length && QUOTE.test(lines[next])) {
    inner.push(lines[next].match(QUOTE)[1]);
    next += 1;
  }
  return { node: el("blockquote", {}, renderMarkdown(inner.join("\n"))), next };
}

function paragraph(lines, i) {
  const node = el("p");
  let next = i;
  while (next < lines.length && lines[next].trim() && (next === i || !startsBlock(lines, next))) {
    if (next > i) node.append(el("br"));
    inline(node, lines[next]);
    next += 1;
  }
  return { node, next };
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line) || QUOTE.test(line)
    || (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]));
}

// ------------------------------------------------------------------ inline

const INLINE = [
  { re: /`([^`\n]+)`/, make: (m) => el("code", { text: m[1] }) },
  { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, make: (m) => link(m[1], m[2]) },
  // Emphasis needs text right inside its markers, and underscores a word boundary outside
  // them, so snake_case and window.__name stay as written.
  { re: /\*\*(?!\s)([^*\n]+?)(?<!\s)\*\*|(?<![^\s([{"'])__(?!\s)([^_\n]+?)(?<!\s)__(?!\w)/, make: (m) => inline(el("strong"), m[1] ?? m[2]) },
  { re: /\*(?![\s*])([^*\n]+?)(?<!\s)\*|(?<![^\s([{"'])_(?![\s_])([^_\n]+?)(?<!\s)_(?!\w)/, make: (m) => inline(el("em"), m[1] ?? m[2]) },
  { re: /\bhttps?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/, make: (m) => link(m[0], m[0], true) },
];

function link(label, href, bare = false) {
  if (!SAFE_LINK.test(href)) return document.createTextNode(`[${label}](${href})`);
  const a = el("a", { rel: "noopener noreferrer nofollow", target: "_blank" });
  a.href = href;
  if (bare) a.textContent = label; // an address written out is its own label: nothing to parse in it
  else inline(a, label);
  return a;
}

/** Appends `text`'s inline markdown to `node` and returns `node`. */
export function inline(node, text) {
  let rest = String(text);
  while (rest) {
    let best = null;
    for (const rule of INLINE) {
      const m = rest.match(rule.re);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) { node.append(document.createTextNode(rest)); break; }
    if (best.m.index > 0) node.append(document.createTextNode(rest.slice(0, best.m.index)));
    node.append(best.rule.make(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
  return node;
}
