// Building the page from data. Text always goes in through textContent or text nodes:
// no model or user text ever becomes markup (the page never uses innerHTML).

/** el("li", {class: "msg", dataset: {role: "user"}}, child, "text", ...) */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "testid") node.dataset.testid = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

/** The click handler of a button that asks for more (an older page): "Loading…", and deaf to clicks,
 * while `load()` runs, so a second click (a double click) cannot ask for the same page again and show it
 * twice; itself again if `load()` comes back falsy (it failed) or throws (a page it could not draw: the
 * error still goes on to the console, but the button does not stay at "Loading…" for good). On success the
 * view replaces the button: the focus it had, which went to the page's body with it, goes to what `load()`
 * came back with if that is an element (the first item shown, the next page's button, the list), unless
 * the person moved it meanwhile. `aria-disabled`, not `disabled`: a disabled button loses the keyboard's
 * focus to the page. */
export function askingOnce(load) {
  return async (event) => {
    const button = event.currentTarget;
    if (button.getAttribute("aria-disabled") === "true") return;
    const label = button.textContent;
    const focused = document.activeElement === button;
    button.setAttribute("aria-disabled", "true");
    button.textContent = "Loading…";
    let shown = false;
    try {
      shown = await load();
    } finally {
      if (!shown) {
        button.removeAttribute("aria-disabled");
        button.textContent = label;
      }
    }
    const lost = !document.activeElement || document.activeElement === document.body;
    if (focused && lost && !button.isConnected && shown instanceof Element) shown.focus();
  };
}

/** Of two loads of the same thing in flight (Refresh clicked twice, a folder opened while another's
 * listing is on its way), the later answer may come first: whichever ends last, only the newest load
 * draws, and only its failure is said. `begin()` starts a load and gives back its `current()`, true
 * until another load begins or `forget()` is called (Sign out: what is on its way was asked for the
 * person who left). Used where a later load replaces an earlier one in place: the files listing, a
 * memory section (its Refresh and Learnings' Search alike: one count, MemoryView.load), the chat's
 * snapshot. Past sessions (sessions.js) and a memory file's view (memory_files.js `open`) decide by
 * the list or the file they were asked for instead: a load of another is not a newer one of theirs. */
export function newest() {
  let latest = 0;
  return {
    begin() {
      const mine = ++latest;
      return () => mine === latest;
    },
    forget() {
      latest += 1;
    },
  };
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

/** Runs `render()`, which rebuilds what is in `box`; if the focus was on a control in there, it goes to
 * that control's successor: the control of the same test id (or of `next[testid]`: Forget's successor is
 * Undo) in the item of the same name, number, id or card id; failing that, the first `fallback` (a
 * selector) in that item, then in `box`. A reload that lands while a keyboard user is on Edit, a file, a
 * card or a learning must not drop their focus to the top of the page. */
export function keepingFocus(box, render, { next = {}, fallback = null } = {}) {
  const had = document.activeElement;
  const at = had && had !== box && box.contains(had) ? focusPath(had, box, next) : null;
  render();
  if (!at) return;
  if (had.isConnected) { // kept, but taken out and put back: a node taken out loses the focus
    if (document.activeElement !== had) had.focus();
    return;
  }
  for (const selector of [at.item + at.control, ...(fallback ? [`${at.item}:is(${fallback})`, `:is(${fallback})`] : [])]) {
    const node = box.querySelector(selector);
    node?.focus();
    if (node && document.activeElement === node) return;
  }
}

const KEYS = { name: "name", number: "number", id: "id", cardId: "card-id" };
const ITEM = Object.values(KEYS).map((k) => `[data-${k}]`).join(", ");

function focusPath(node, box, next) {
  const key = (item) => Object.entries(KEYS).filter(([k]) => item.dataset[k] !== undefined)
    .map(([k, attr]) => `[data-${attr}="${CSS.escape(item.dataset[k])}"]`).join("");
  const item = node.parentElement?.closest(ITEM);
  const testid = node.dataset.testid ? next[node.dataset.testid] ?? node.dataset.testid : "";
  return {
    item: item && item !== box && box.contains(item) ? `${item.tagName.toLowerCase()}${key(item)} ` : "",
    control: testid ? `[data-testid="${CSS.escape(testid)}"]` : node.tagName.toLowerCase(),
  };
}

const pad = (n) => String(n).padStart(2, "0");

/** 2026-11-20 10:15, in the reader's time zone. */
export function when(seconds) {
  if (!seconds) return "never";
  const d = new Date(seconds * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

export function day(seconds) {
  return when(seconds).slice(0, 10);
}

/** "in 40 s", "3 min ago" */
export function relative(seconds, now = Date.now() / 1000) {
  const delta = Math.round(seconds - now);
  const size = Math.abs(delta);
  const text = size < 90 ? `${size} s` : size < 5400 ? `${Math.round(size / 60)} min` : `${Math.round(size / 3600)} h`;
  return delta >= 0 ? `in ${text}` : `${text} ago`;
}

export function count(n) {
  return Number(n || 0).toLocaleString("en-US");
}

export function dollars(n) {
  const value = Number(n || 0);
  return value > 0 && value < 0.0001 ? "under $0.0001" : `$${value.toFixed(4)}`;
}

export function plural(n, word, many = `${word}s`) {
  return `${count(n)} ${n === 1 ? word : many}`;
}

/** 512 bytes, 1.5 KB, 3.0 MB: as the server words sizes. */
export function size(bytes) {
  if (bytes < 1024) return `${bytes} bytes`;
  const units = ["KB", "MB", "GB", "TB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(1)} ${units[unit]}`;
}
