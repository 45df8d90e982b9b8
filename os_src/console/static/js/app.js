// The console's entry point: the token (typed once, kept in this tab's sessionStorage,
// never in the URL), the tabs, the theme, the connection's state, and the views.

import { CanvasView } from "./canvas.js";
import { ChatView } from "./chat.js";
import { Connection } from "./connection.js";
import { MemoryView } from "./memory.js";

const TOKEN_KEY = "sprite-os.token";
const THEME_KEY = "sprite-os.theme";
const $ = (id) => document.getElementById(id);

const connection = new Connection({ onFrame, onStatus, onAuthFailed });
const chat = new ChatView({
  list: $("messages"), form: $("composer-form"), composer: $("composer"), send: $("send"),
  interrupt: $("interrupt"), newSession: $("new-session"), agentState: $("agent-state"),
}, connection);
const canvas = new CanvasView($("cards"), $("card-count"));
const memory = new MemoryView($("view-memory"), connection);

function onFrame(frame) {
  chat.handle(frame);
  canvas.handle(frame);
}

function onStatus({ state, attempt, delay, resumed, replayed, resync }) {
  const status = $("status");
  status.dataset.state = state;
  status.dataset.attempt = String(attempt ?? 0);
  if (state === "connected") {
    status.textContent = "connected";
    if (resumed) {
      chat.notice(resync ? "Reconnected. The server restarted meanwhile: what happened before is not shown here, the canvas is current."
        : `Reconnected and resumed${replayed ? `: ${replayed} missed event${replayed === 1 ? "" : "s"} shown below` : ""}.`, "reconnected");
    }
  } else if (state === "waiting") {
    status.textContent = `offline: retrying in ${delay.toFixed(1)} s (attempt ${attempt})`;
  } else {
    status.textContent = state === "connecting" ? "connecting…" : "reconnecting…";
  }
  $("send").disabled = state !== "connected";
}

function onAuthFailed(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(message);
  $("status").dataset.state = "auth-failed";
  $("status").textContent = "signed out";
}

function showLogin(error = "") {
  $("login").hidden = false;
  $("app").hidden = true;
  $("login-error").textContent = error;
  $("token").value = "";
  $("token").focus();
}

function start(token) {
  $("login").hidden = true;
  $("app").hidden = false;
  connection.start(token);
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  start(token);
});

$("sign-out").addEventListener("click", () => {
  connection.stop();
  sessionStorage.removeItem(TOKEN_KEY);
  $("status").dataset.state = "signed-out";
  $("status").textContent = "signed out";
  showLogin();
});

function showView(name) {
  document.body.dataset.view = name;
  $("view-memory").hidden = name !== "memory";
  $("view-chat").hidden = name === "memory";
  for (const tab of document.querySelectorAll("[data-view]")) tab.setAttribute("aria-selected", String(tab.dataset.view === name));
  if (name === "memory") memory.show();
}

for (const tab of document.querySelectorAll("nav.tabs [data-view]")) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
}

const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
function applyTheme() {
  const chosen = localStorage.getItem(THEME_KEY);
  document.documentElement.dataset.theme = chosen || (systemDark.matches ? "dark" : "light");
}
systemDark.addEventListener("change", applyTheme);
$("theme-toggle").addEventListener("click", () => {
  localStorage.setItem(THEME_KEY, document.documentElement.dataset.theme === "dark" ? "light" : "dark");
  applyTheme();
});

applyTheme();
showView("chat");
const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) start(saved);
else showLogin();
