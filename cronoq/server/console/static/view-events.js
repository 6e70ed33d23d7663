// Events (client role): every status change as it happens, from the Watch stream over HTTP
// (GET /v1/events, one JSON object per line). The stream is reconnected when it ends.

import { isTaskId, stream } from "./api.js";
import { h } from "./dom.js";
import { time } from "./format.js";

const KEEP = 300;
const RETRY_MS = 1000;

function taskLink(id) {
  return isTaskId(id) ? h("a", { href: `#/task/${id}` }, id) : String(id);
}

export function mount(section, { query }) {
  const pool = query.get("pool") || "";
  const state = h("span", { class: "live", id: "stream-state", dataset: { state: "connecting" } }, "connecting");
  const body = h("tbody", { id: "events" });
  const filter = h("input", { name: "pool", value: pool, placeholder: "every pool", "aria-label": "Pools" });
  const form = h("form", { class: "inline" }, h("label", null, "Pools ", filter), h("button", { type: "submit" },
    "Follow"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const value = filter.value.trim();
    location.hash = value ? `#/events?pool=${encodeURIComponent(value)}` : "#/events";
  });
  section.append(h("h2", null, "Events ", state), form,
    h("table", null, h("thead", null, h("tr", null, ["Time", "Task", "Pool", "Key", "Status", "Attempt", "Message"]
      .map((text) => h("th", null, text)))), body));
  const controller = new AbortController();

  function setState(name, text) {
    state.dataset.state = name;
    state.textContent = text;
  }

  function onLine(line) {
    if (line.subscribed) {
      const missing = line.subscribed.unavailable_shards;
      setState("live", missing.length ? `live (shards not answering: ${missing.join(", ")})` : "live");
    } else if (line.event) {
      const e = line.event;
      body.prepend(h("tr", { dataset: { task: e.id, status: e.status } },
        h("td", null, time(e.at_unix_ns)), h("td", null, taskLink(e.id)), h("td", null, e.pool),
        h("td", null, e.key || ""), h("td", { class: `status ${e.status}` }, e.status),
        h("td", { class: "num" }, e.attempt), h("td", { class: "message" }, e.message || "")));
      while (body.rows.length > KEEP) body.deleteRow(body.rows.length - 1);
    } else if (line.end && line.end.error) {
      setState("error", `ended: ${line.end.error}`);
    }
  }

  (async () => {
    while (!controller.signal.aborted) {
      try {
        await stream("/v1/events", { all_transitions: "true", pool }, onLine, controller.signal);
        setState("reconnecting", "reconnecting");
      } catch (error) {
        if (controller.signal.aborted) return;
        setState("error", `disconnected: ${error.message}; retrying`);
      }
      await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
    }
  })();
  return () => controller.abort();
}
