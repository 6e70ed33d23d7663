// Workers (metrics role): every connected worker of every shard.

import { get } from "./api.js";
import { h, replace, table } from "./dom.js";
import { ago, time } from "./format.js";
import { every } from "./poll.js";

export function mount(section) {
  const box = h("div", { id: "workers" });
  const note = h("p", { class: "muted", role: "status" });
  section.append(h("h2", null, "Workers"), note, box);
  return every(3000, async (signal) => {
    const answer = await get("/v1/workers", null, signal);
    const missing = answer.unavailable_shards || [];
    note.textContent = `${answer.workers.length} connected` +
      (missing.length ? ` · shards not answering: ${missing.join(", ")}` : "");
    const rows = answer.workers.map((worker) => h("tr", { dataset: { worker: worker.name } },
      h("td", null, worker.name), h("td", null, worker.pool),
      h("td", null, Object.entries(worker.labels).map(([k, v]) => `${k}=${v}`).join(", ")),
      h("td", { class: "num" }, worker.busy), h("td", { class: "num" }, worker.slots),
      h("td", { title: time(worker.connected_unix_ns) }, ago(worker.connected_unix_ns))));
    replace(box, table(["Name", "Pool", "Labels", "Busy", "Slots", "Connected"], rows));
  }, (error) => {
    note.textContent = `Could not refresh: ${error.message}`;
  });
}
