// The console's entry point: sign-in, navigation between views, and the role rules of the page.
// The server checks every call again; the page only leaves out what the token may not do.

import { ApiError, call, session } from "./api.js";
import { h, replace } from "./dom.js";
import * as events from "./view-events.js";
import * as overview from "./view-overview.js";
import * as schedules from "./view-schedules.js";
import * as task from "./view-task.js";
import * as tasks from "./view-tasks.js";
import * as workers from "./view-workers.js";

// Which role each view needs (admin has every role).
const VIEWS = [
  { path: "overview", title: "Overview", role: "metrics", view: overview },
  { path: "workers", title: "Workers", role: "metrics", view: workers },
  { path: "schedules", title: "Schedules", role: "metrics", view: schedules },
  { path: "tasks", title: "Tasks", role: "client", view: tasks },
  { path: "events", title: "Events", role: "client", view: events },
  { path: "task", title: "Task", role: "client", view: task, hidden: true },
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const signOut = document.getElementById("sign-out");
let current = null; // the mounted view's teardown
let identity = null;

function grants(role) {
  return identity !== null && (identity.role === "admin" || identity.role === role);
}

function parseHash() {
  const text = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = text.split("?");
  const [name, ...rest] = path.split("/");
  return { name: name || "", args: rest.map(decodeURIComponent), query: new URLSearchParams(query) };
}

function defaultView() {
  return VIEWS.find((entry) => !entry.hidden && grants(entry.role));
}

function renderNav(active) {
  replace(nav, VIEWS.filter((entry) => !entry.hidden && grants(entry.role)).map((entry) =>
    h("a", { href: `#/${entry.path}`, class: entry.path === active ? "active" : null,
      "aria-current": entry.path === active ? "page" : null }, entry.title)));
}

function route() {
  if (current) current();
  current = null;
  if (identity === null) return;
  const { name, args, query } = parseHash();
  const entry = VIEWS.find((view) => view.path === name) || defaultView();
  renderNav(entry && entry.path);
  const section = h("section", { class: "view", dataset: { view: entry ? entry.path : "none" } });
  replace(main, section);
  if (!entry) {
    section.append(h("p", { class: "error" }, "This token has no role the console can show (worker tokens run tasks)."));
    return;
  }
  if (!grants(entry.role)) {
    section.append(h("p", { class: "error", dataset: { denied: entry.role } },
      `This view needs the ${entry.role} role; this token has the ${identity.role} role.`));
    return;
  }
  current = entry.view.mount(section, { args, query, grants, identity, navigate });
}

export function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function showSignIn(message) {
  identity = null;
  replace(nav);
  who.textContent = "";
  signOut.hidden = true;
  // No name on the field and form-action 'none' in the policy: the token can never be submitted
  // as a form (into a URL); it only leaves the tab in the authorization header.
  const input = h("input", { type: "password", id: "token", autocomplete: "off",
    spellcheck: "false", required: true, "aria-label": "Token" });
  const problem = h("p", { class: "error", role: "alert" }, message || "");
  const form = h("form", { class: "sign-in", id: "sign-in" },
    h("h1", null, "Sign in"),
    h("p", { class: "muted" }, "Paste a cronoq token. It is kept for this tab only and sent only to this server."),
    h("label", { for: "token" }, "Token"), input,
    h("button", { type: "submit" }, "Sign in"), problem);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!/^[\x21-\x7e]+$/.test(token)) {
      problem.textContent = "A token is visible ASCII characters without spaces.";
      return;
    }
    try {
      await start(token);
    } catch (error) {
      problem.textContent = error instanceof ApiError && error.status === 401 ? "Unknown token." : error.message;
    }
  });
  replace(main, form);
  input.focus();
}

// Who the token is (GET /v1/whoami), then the views it may use.
async function start(token) {
  const found = await call("GET", "/v1/whoami", { token: token === undefined ? session.token() : token });
  if (token !== undefined) session.set(token);
  identity = found;
  const scope = found.pools ? ` · pools ${found.pools.join(", ")}` : "";
  who.textContent = found.authentication ? `role ${found.role}${scope}` : "authentication off";
  who.dataset.role = found.role;
  signOut.hidden = !found.authentication;
  route();
}

signOut.addEventListener("click", () => {
  session.clear();
  if (current) current();
  current = null;
  showSignIn("Signed out.");
});
window.addEventListener("hashchange", route);

start().catch((error) => {
  if (error instanceof ApiError && error.status === 401) {
    session.clear();
    showSignIn("");
  } else {
    showSignIn(`The server did not answer: ${error.message}`);
  }
});
