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

// Block quotes deeper than this are shown as text: each level is a nested call, and a reply of
// thousands of "> " (a hostile card body) overflowed the stack, and its whole view failed to draw.
const MAX_QUOTE_DEPTH = 16;

export function renderMarkdown(text, depth = 0) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i += 1; continue; }
    const block = [fence, heading, rule, table, list, quote, paragraph]
      .map((reader) => reader(lines, i, depth)).find(Boolean);
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

function quote(lines, i, depth) {
  if (depth >= MAX_QUOTE_DEPTH || !QUOTE.test(lines[i])) return null;
  const inner = [];
  let next = i;
  while (next < lines.length && QUOTE.test(lines[next])) {
    inner.push(lines[next].match(QUOTE)[1]);
    next += 1;
  }
  return { node: el("blockquote", {}, renderMarkdown(inner.join("\n"), depth + 1)), next };
}

function paragraph(lines, i, depth) {
  const node = el("p");
  let next = i;
  while (next < lines.length && lines[next].trim() && (next === i || !startsBlock(lines, next, depth))) {
    if (next > i) node.append(el("br"));
    inline(node, lines[next]);
    next += 1;
  }
  return { node, next };
}

function startsBlock(lines, i, depth) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || ITEM.test(line) || (QUOTE.test(line) && depth < MAX_QUOTE_DEPTH)
    || (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]));
}

// ------------------------------------------------------------------ inline

// A link's label and address are bounded: unbounded, each "[" of a text without its "](…)" was a scan to
// the text's end.
const INLINE = [
  { re: /`([^`\n]+)`/, make: (m) => el("code", { text: m[1] }) },
  { re: /\[([^\]\n]{1,500})\]\(([^)\s]{1,2048})\)/, make: (m) => link(m[1], m[2]) },
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

for (const rule of INLINE) rule.here = new RegExp(rule.re.source, "y"); // a match that begins right here

/** Appends `text`'s inline markdown to `node` and returns `node`. Each step takes the earliest match of
 * the rules in what is left of the text (`rest`; the earlier rule on a tie). A rule's match is looked for
 * again only once the text before it was taken: looking for every rule at every step cost a scan of the
 * whole rest each time, and a 10,000-character reply of markers and unclosed links took 8 s (the page
 * frozen), a longer one minutes. What a rule found further on from an earlier step stands, since the text
 * between is the same, but for a match that begins right at the new start, whose text before it was
 * taken (a lookbehind, \b), which `here` tries. */
export function inline(node, text) {
  const source = String(text);
  const found = INLINE.map(() => null); // per rule: {at: where its next match begins (Infinity: none), m}
  let start = 0;
  while (start < source.length) {
    const rest = source.slice(start);
    let best = null;
    INLINE.forEach((rule, k) => {
      let next = found[k];
      if (next === null || (next.m && next.at < start)) {
        const m = rest.match(rule.re);
        next = found[k] = m ? { at: start + m.index, m } : { at: Infinity, m: null };
      } else if (next.at !== start) {
        rule.here.lastIndex = 0;
        const m = rule.here.exec(rest);
        if (m) next = found[k] = { at: start, m };
      }
      if (next.m && (best === null || next.at < best.at)) best = { ...next, rule };
    });
    if (best === null) { node.append(document.createTextNode(rest)); break; }
    if (best.at > start) node.append(document.createTextNode(source.slice(start, best.at)));
    node.append(best.rule.make(best.m));
    start = best.at + best.m[0].length;
  }
  return node;
}
