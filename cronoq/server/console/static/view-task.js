// A task (client role): what it is (its stored spec), each attempt with its messages, the
// timeline of its status changes, previews of its payload and output, and Cancel while it runs.
// Refreshed every 2 s until the task has finished.

import { ApiError, call, get, isTaskId } from "./api.js";
import { field, h, replace, table } from "./dom.js";
import { TERMINAL, bytes, nsToDate, seconds, time } from "./format.js";
import { every } from "./poll.js";

function preview(title, part) {
  if (!part) return null;
  const note = `${bytes(part.bytes)}${part.content_type ? `, ${part.content_type}` : ""}` +
    (part.truncated ? " · first 4 KiB shown" : "");
  return h("section", { class: "preview" }, h("h3", null, title, h("span", { class: "muted" }, ` ${note}`)),
    h("pre", { class: "data" }, part.preview_text));
}

function specList(spec) {
  if (!spec) return h("p", { class: "muted" }, "The stored spec is not available (memory store, or pruned).");
  const items = [];
  for (const [name, value] of Object.entries(spec)) {
    let text = value;
    if (name.endsWith("_unix_ns")) text = time(value);
    else if (typeof value === "object") text = JSON.stringify(value);
    items.push(field(name, String(text)));
  }
  return h("dl", { class: "spec" }, items);
}

function attempts(transitions) {
  const groups = new Map();
  for (const change of transitions) {
    if (change.attempt === 0) continue;
    if (!groups.has(change.attempt)) groups.set(change.attempt, []);
    groups.get(change.attempt).push(change);
  }
  if (!groups.size) return h("p", { class: "muted" }, "No attempt has started yet.");
  return h("ol", { class: "attempts" }, [...groups.entries()].map(([attempt, changes]) =>
    h("li", { dataset: { attempt: String(attempt) } }, h("strong", null, `Attempt ${attempt}`),
      h("ul", null, changes.map((change) => h("li", { dataset: { status: change.status } },
        h("span", { class: `status ${change.status}` }, change.status),
        change.at_unix_ns ? ` at ${time(change.at_unix_ns)}` : "",
        change.retry_unix_ns ? ` · retry at ${time(change.retry_unix_ns)}` : "",
        change.message ? h("span", { class: "message" }, ` — ${change.message}`) : ""))))));
}

function timeline(info, transitions) {
  const rows = [];
  if (info.created_unix_ns) rows.push(["submitted", "", info.created_unix_ns, ""]);
  for (const change of transitions) rows.push([change.status, change.attempt, change.at_unix_ns, change.message || ""]);
  let previous = null;
  return table(["Status", "Attempt", "When", "After", "Message"], rows.map(([status, attempt, at, message]) => {
    const date = nsToDate(at);
    const gap = date && previous ? seconds((date - previous) / 1000) : "";
    if (date) previous = date;
    return h("tr", null, h("td", { class: `status ${status}` }, status), h("td", { class: "num" }, attempt),
      h("td", null, at ? time(at) : ""), h("td", null, gap), h("td", { class: "message" }, message));
  }), { class: "timeline", id: "timeline" });
}

export function mount(section, { args, grants }) {
  const id = args[0];
  if (!isTaskId(id)) {
    section.append(h("p", { class: "error" }, "Not a task id."));
    return () => {};
  }
  const body = h("div", { id: "task", dataset: { task: id } });
  const note = h("p", { class: "muted", role: "status" });
  section.append(h("h2", null, `Task ${id}`), note, body);
  let finished = false;
  let stop = null;

  async function cancel() {
    try {
      const answer = await call("DELETE", `/v1/tasks/${id}`);
      note.textContent = answer.cancelled ? "Cancelled." : "It had already finished.";
    } catch (error) {
      note.textContent = `Could not cancel: ${error.message}`;
    }
    stop.now();
  }

  stop = every(2000, async (signal) => {
    if (finished) return;
    const detail = await get(`/v1/tasks/${id}/detail`, null, signal);
    const info = detail.task;
    finished = TERMINAL.has(info.status);
    const canCancel = !finished && grants("client");
    replace(body,
      h("dl", { class: "summary" },
        field("Status", h("span", { class: `status ${info.status}`, id: "task-status" }, info.status)),
        field("Pool", info.pool), field("Key", info.key || "—"), field("Kind", info.kind),
        field("Tenant", info.tenant || "—"), field("Priority", info.priority),
        field("Attempt", `${info.attempt} of ${info.max_attempts}`),
        field("Submitted", time(info.created_unix_ns)), field("Started", time(info.started_unix_ns)),
        field("Finished", time(info.finished_unix_ns)), field("Message", info.message || "—")),
      canCancel ? h("button", { type: "button", class: "danger", id: "cancel", onclick: cancel }, "Cancel") : null,
      h("h3", null, "Attempts"), attempts(detail.transitions),
      h("h3", null, "Timeline"), timeline(info, detail.transitions),
      h("h3", null, "Spec"), specList(detail.spec),
      preview("Payload", detail.payload), preview("Output", detail.output));
    if (detail.unavailable_shards && detail.unavailable_shards.length) {
      note.textContent = `Shards not answering: ${detail.unavailable_shards.join(", ")}`;
    } else if (finished && !note.textContent) {
      note.textContent = "Finished.";
    }
  }, (error) => {
    note.textContent = error instanceof ApiError && error.status === 404
      ? "No such task (or not in this token's pools, or no longer kept)." : `Could not load: ${error.message}`;
  });
  return stop;
}
