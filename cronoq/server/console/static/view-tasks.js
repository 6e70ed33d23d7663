// Tasks (client role): search live and past tasks across every shard (the store keeps finished
// ones for store.keep_finished_s), with the filters of GET /v1/tasks, newest first, page by page.

import { get, isTaskId } from "./api.js";
import { h, replace, table } from "./dom.js";
import { STATUSES, localToNs, nsToLocal, time } from "./format.js";

const FILTERS = ["pool", "status", "kind", "tenant", "key_prefix", "created_from_unix_ns", "created_to_unix_ns"];
const PAGE = 50;

function input(name, label, value, attrs) {
  return h("label", null, label, h("input", { name, value: value || "", ...attrs }));
}

export function mount(section, { query, navigate }) {
  const values = Object.fromEntries(FILTERS.map((name) => [name, query.get(name) || ""]));
  const oldestFirst = query.get("order") === "oldest";
  const chosen = new Set(values.status.split(",").filter(Boolean));
  const statusBoxes = STATUSES.map((status) => h("label", { class: "check" },
    h("input", { type: "checkbox", name: "status", value: status, checked: chosen.has(status) }), status));
  const form = h("form", { class: "filters", id: "search" },
    input("pool", "Pools", values.pool, { placeholder: "a,b" }),
    input("kind", "Kinds", values.kind),
    input("tenant", "Tenants", values.tenant),
    input("key_prefix", "Key starts with", values.key_prefix),
    input("from", "Submitted from", nsToLocal(values.created_from_unix_ns), { type: "datetime-local", step: "1" }),
    input("to", "Submitted before", nsToLocal(values.created_to_unix_ns), { type: "datetime-local", step: "1" }),
    h("fieldset", { class: "statuses" }, h("legend", null, "Statuses"), statusBoxes),
    h("label", { class: "check" }, h("input", { type: "checkbox", name: "oldest", checked: oldestFirst }),
      "oldest first"),
    h("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const params = new URLSearchParams();
    for (const name of ["pool", "kind", "tenant", "key_prefix"]) {
      const value = String(data.get(name) || "").trim();
      if (value) params.set(name, value);
    }
    const statuses = data.getAll("status").join(",");
    if (statuses) params.set("status", statuses);
    const from = localToNs(String(data.get("from") || ""));
    const to = localToNs(String(data.get("to") || ""));
    if (from) params.set("created_from_unix_ns", from);
    if (to) params.set("created_to_unix_ns", to);
    if (data.get("oldest")) params.set("order", "oldest");
    navigate(`#/tasks?${params}`);
  });
  const results = h("div", { id: "results" });
  const note = h("p", { class: "muted", role: "status" });
  const more = h("button", { type: "button", id: "more", hidden: true }, "More");
  section.append(h("h2", null, "Tasks"), form, note, results, more);

  const controller = new AbortController();
  const rows = [];
  let cursor = "";
  async function load() {
    const request = { limit: PAGE, newest_first: oldestFirst ? "" : "true", after: cursor };
    for (const name of FILTERS) request[name] = values[name];
    const answer = await get("/v1/tasks", request, controller.signal);
    for (const task of answer.tasks) {
      rows.push(h("tr", { dataset: { task: task.id, status: task.status } },
        h("td", null, isTaskId(task.id) ? h("a", { href: `#/task/${task.id}` }, task.id) : task.id),
        h("td", null, task.pool), h("td", null, task.key || ""), h("td", null, task.kind),
        h("td", null, task.tenant || ""), h("td", { class: `status ${task.status}` }, task.status),
        h("td", { class: "num" }, `${task.attempt}/${task.max_attempts}`),
        h("td", null, time(task.created_unix_ns)), h("td", null, time(task.finished_unix_ns)),
        h("td", { class: "message" }, task.message || "")));
    }
    replace(results, table(["Id", "Pool", "Key", "Kind", "Tenant", "Status", "Attempt", "Submitted", "Finished",
      "Message"], rows));
    cursor = answer.next_after || "";
    more.hidden = !cursor;
    const missing = answer.unavailable_shards || [];
    note.textContent = `${rows.length} task${rows.length === 1 ? "" : "s"}${cursor ? " (more follow)" : ""}` +
      (missing.length ? ` · shards not answering: ${missing.join(", ")}` : "");
    note.dataset.count = String(rows.length);
  }
  function run() {
    load().catch((error) => {
      if (!controller.signal.aborted) note.textContent = `Search failed: ${error.message}`;
    });
  }
  more.addEventListener("click", run);
  run();
  return () => controller.abort();
}
