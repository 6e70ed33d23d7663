// Schedules (metrics role): every recurring schedule with its next runs. Admins pause, resume and
// remove them.

import { call, get, isTaskId } from "./api.js";
import { h, replace, table } from "./dom.js";
import { time } from "./format.js";
import { every } from "./poll.js";

function actions(schedule, act) {
  const name = schedule.name;
  return [
    schedule.paused
      ? h("button", { type: "button", dataset: { action: "resume" }, onclick: () => act("resume", name) }, "Resume")
      : h("button", { type: "button", dataset: { action: "pause" }, onclick: () => act("pause", name) }, "Pause"),
    h("button", { type: "button", class: "danger", dataset: { action: "remove" }, onclick: () => {
      if (window.confirm(`Remove the schedule "${name}"? Runs already created stay.`)) act("remove", name);
    } }, "Remove"),
  ];
}

export function mount(section, { grants }) {
  const admin = grants("admin");
  const box = h("div", { id: "schedules" });
  const note = h("p", { class: "muted", role: "status" });
  section.append(h("h2", null, "Recurring schedules"), note, box);
  let stop = null;

  async function act(action, name) {
    const path = `/v1/recurring/${encodeURIComponent(name)}` + (action === "remove" ? "" : `/${action}`);
    try {
      await call(action === "remove" ? "DELETE" : "POST", path);
      note.textContent = `${action === "remove" ? "Removed" : action === "pause" ? "Paused" : "Resumed"} ${name}.`;
    } catch (error) {
      note.textContent = `Could not ${action} ${name}: ${error.message}`;
    }
    stop.now();
  }

  stop = every(5000, async (signal) => {
    const answer = await get("/v1/schedules", null, signal);
    const rows = answer.schedules.map((schedule) => h("tr",
      { dataset: { schedule: schedule.name, state: schedule.paused ? "paused" : "active" } },
      h("td", null, schedule.name), h("td", null, schedule.pool),
      h("td", null, h("code", null, schedule.cron), schedule.tz ? ` (${schedule.tz})` : ""),
      h("td", null, schedule.overlap),
      h("td", { class: "state" }, schedule.paused ? "paused" : "active"),
      h("td", null, h("ul", { class: "plain" },
        (schedule.next_runs_unix_ns || []).map((ns) => h("li", null, time(ns))))),
      h("td", null, isTaskId(schedule.last_task_id) && grants("client")
        ? h("a", { href: `#/task/${schedule.last_task_id}` }, schedule.last_task_id) : schedule.last_task_id || ""),
      admin ? h("td", { class: "actions" }, actions(schedule, act)) : null));
    const headings = ["Name", "Pool", "Cron", "Overlap", "State", "Next runs", "Last run"];
    replace(box, table(admin ? [...headings, ""] : headings, rows));
    const missing = answer.unavailable_shards || [];
    if (missing.length) note.textContent = `Shards not answering: ${missing.join(", ")}`;
  }, (error) => {
    note.textContent = `Could not refresh: ${error.message}`;
  });
  return stop;
}
