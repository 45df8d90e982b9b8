// The console's entry point: the token (typed once, kept in this tab's sessionStorage where the
// browser lets the page keep it, never in the URL), the tabs, the theme, the connection's state, and
// the views.

import { CanvasView } from "./canvas.js";
import { ChatView } from "./chat.js";
import { Connection } from "./connection.js";
import { FilesView, dropped } from "./files.js";
import { MemoryView } from "./memory.js";
import { PastSessions } from "./sessions.js";
import { localStore, sessionStore } from "./storage.js";

const TOKEN_KEY = "sprite-os.token";
const THEME_KEY = "sprite-os.theme";
const $ = (id) => document.getElementById(id);

const connection = new Connection({ onFrame, onStatus, onAuthFailed });
const chat = new ChatView({
  list: $("messages"), form: $("composer-form"), composer: $("composer"), send: $("send"),
  interrupt: $("interrupt"), newSession: $("new-session"), agentState: $("agent-state"), jump: $("jump"),
  sessionCost: $("session-cost"),
}, connection);
const canvas = new CanvasView($("cards"), $("card-count"), connection, (text) => chat.notice(text, "error"));
const memory = new MemoryView($("view-memory"), connection);
const files = new FilesView($("view-files"), connection);
const past = new PastSessions($("past-sessions"), $("past-toggle"), connection, () => { $("conversation").hidden = false; });
$("past-toggle").addEventListener("click", () => { $("conversation").hidden = past.open; });

function onFrame(frame, { skipped }) {
  chat.handle(frame, { skipped });
  canvas.handle(frame);
  files.handle(frame);
  past.handle(frame);
}

function onStatus({ state, attempt, delay, resumed, replayed, resync }) {
  const status = $("status");
  status.dataset.state = state;
  status.dataset.attempt = String(attempt ?? 0);
  if (state === "connected") {
    status.textContent = "connected";
    if (resumed && !resync) { // a snapshot (a restart, a long gap) is the chat view's to say: it rebuilds
      chat.notice(`Reconnected and resumed${replayed ? `: ${replayed} missed event${replayed === 1 ? "" : "s"} shown below` : ""}.`, "reconnected");
    }
  } else if (state === "waiting") {
    status.textContent = `offline: retrying in ${delay.toFixed(1)} s (attempt ${attempt})`;
  } else {
    status.textContent = state === "connecting" ? "connecting…" : "reconnecting…";
  }
  $("send").disabled = !connection.connected; // as Enter: a message goes once the socket is open, `ready` or not
}

function onAuthFailed(message) {
  sessionStore.remove(TOKEN_KEY);
  showLogin(message + files.stoppedNote()); // the transfers it stopped: the Files view is out of sight
  $("status").dataset.state = "auth-failed";
  $("status").textContent = "signed out";
}

function showLogin(error = "") {
  $("login").hidden = false;
  $("app").hidden = true;
  // The next sign-in, after Sign out or a refused token, starts where a fresh page does, on the chat: a
  // Memory or Files view shown at once would ask the Sprite before the new socket is open ("Not
  // connected"), and load nothing.
  past.close();
  canvas.closeView(); // a card opened large, a modal dialog: the form would come back inert behind it
  showView("chat");
  $("login-error").textContent = error;
  $("token").value = "";
  $("token").focus();
}

function start(token) {
  $("login").hidden = true;
  $("app").hidden = false;
  connection.start(token);
  showView(document.body.dataset.view || "chat");
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStore.set(TOKEN_KEY, token); // where storage is denied, it lives for the page only
  start(token);
});

$("sign-out").addEventListener("click", () => {
  connection.stop();
  sessionStore.remove(TOKEN_KEY);
  memory.signOut(); // their drafts of memory files (Save would write them under the next sign-in), their searches
  chat.signOut(); // the person's words too: the draft, the messages kept for a reload, from the page as well
  files.signOut(); // what the Files view shows of them (their transfers ended with the sign-in, at stop())
  $("status").dataset.state = "signed-out";
  $("status").textContent = "signed out";
  showLogin();
});

// A file dropped anywhere on the console but the Files view's drop zone (the chat, the header, the
// sign-in form) made the browser open it in the tab, leaving the console; so did a link dropped
// anywhere but a text field. Signed in, a file is uploaded as one dropped on the zone is, with the Files
// view shown; signed out, nothing happens. Text or a link dragged into a text field (the composer) is
// the browser's, as ever.
const carriesFiles = (event) => event.dataTransfer?.types.includes("Files");
const intoText = (event) => event.target instanceof Element && event.target.closest(":read-write"); // an editable field
// While files are dragged over the console, signed in, it says so (a drop anywhere uploads at once): on
// each dragover, which the browser repeats while the drag is over the page (about every 350 ms, give or
// take 200, moving or not); gone at the drop, on leaving the window, or a second after the last dragover
// (a drag ended with Escape, or where the leaving went unseen, says nothing here).
// A popover where the browser has them: in the top layer, above a card open large (a modal dialog).
const cue = $("drop-cue");
const popover = typeof cue.showPopover === "function";
if (popover) cue.hidden = false; // closed, the popover is not shown
else cue.removeAttribute("popover");
const cueShown = (shown) => {
  if (!popover) cue.hidden = !shown;
  else if (shown !== cue.matches(":popover-open")) (shown ? cue.showPopover() : cue.hidePopover());
};
let cueTimer = null;
const hideCue = () => { clearTimeout(cueTimer); cueShown(false); };
window.addEventListener("dragover", (event) => {
  if (!carriesFiles(event) && intoText(event)) return;
  event.preventDefault();
  if ($("app").hidden || !carriesFiles(event)) {
    event.dataTransfer.dropEffect = "none"; // the cursor says no drop
    hideCue(); // signed out meanwhile (a refused token)
    return;
  }
  cueShown(true);
  clearTimeout(cueTimer);
  cueTimer = setTimeout(hideCue, 1000);
});
window.addEventListener("dragleave", (event) => { if (!event.relatedTarget) hideCue(); }); // out of the window
window.addEventListener("drop", (event) => {
  hideCue();
  if (event.defaultPrevented) return; // the drop zone's own
  if (!carriesFiles(event)) {
    if (!intoText(event)) event.preventDefault(); // a link or text over the page: not opened in the tab
    return;
  }
  event.preventDefault();
  if ($("app").hidden) return;
  const what = dropped(event.dataTransfer); // read now: the drop's items are gone after its event
  canvas.closeView(); // a card open large, a modal dialog, would hide the upload behind it
  showView("files");
  files.uploadDropped(what);
});

const tabs = [...document.querySelectorAll("nav.tabs [data-view]")];

function showView(name) {
  document.body.dataset.view = name;
  $("view-memory").hidden = name !== "memory";
  $("view-files").hidden = name !== "files";
  $("view-chat").hidden = name === "memory" || name === "files";
  for (const tab of tabs) {
    const selected = tab.dataset.view === name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1; // one tab stop for the tab list; arrows move between tabs
  }
  if (name === "memory") memory.show();
  if (name === "files") files.show();
  if (name === "chat" && !$("app").hidden) $("composer").focus();
}

for (const [index, tab] of tabs.entries()) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    const to = event.key === "Home" ? 0 : event.key === "End" ? tabs.length - 1 : step ? (index + step + tabs.length) % tabs.length : null;
    if (to === null) return;
    event.preventDefault();
    tabs[to].focus();
    showView(tabs[to].dataset.view);
  });
}

const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
let pageTheme = null; // the theme chosen in this page: the one it keeps where the browser lets it keep none
function applyTheme() {
  const chosen = localStore.get(THEME_KEY) || pageTheme;
  const theme = chosen || (systemDark.matches ? "dark" : "light");
  document.documentElement.dataset.theme = theme;
  $("theme-toggle").setAttribute("aria-pressed", String(theme === "dark"));
}
systemDark.addEventListener("change", applyTheme);
$("theme-toggle").addEventListener("click", () => {
  pageTheme = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  localStore.set(THEME_KEY, pageTheme);
  applyTheme();
});

applyTheme();
document.body.dataset.view = "chat";
const saved = sessionStore.get(TOKEN_KEY);
if (saved) start(saved);
else showLogin();
