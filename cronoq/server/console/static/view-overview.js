// Overview (metrics role): every shard with its leader and replicas, or why it is missing; every
// pool with its numbers and live charts of backlog, waits and workers.

import { get } from "./api.js";
import { LineChart } from "./chart.js";
import { field, h, replace, table } from "./dom.js";
import { ago, number, percent, seconds } from "./format.js";
import { every } from "./poll.js";

const PERIOD_MS = 2000;
const CLASSES = ["critical", "high", "normal", "low"];

// The replicas [[shards]] replicas lists, as the leader found them: leader, standby or unavailable.
function replicaList(replicas) {
  if (!replicas || !replicas.length) return "none listed in the configuration";
  return h("ul", { class: "replicas" }, replicas.map((r) => h("li",
    { class: `replica ${r.state}`, dataset: { replica: r.endpoint, state: r.state } },
    h("span", { class: "badge" }, r.state), ` ${r.endpoint}`,
    r.state === "unavailable" ? ` · ${r.error}` : ` · ${r.host}, pid ${r.pid}`)));
}

function shardCard(name, info, state) {
  const title = name || "(unsharded)";
  const details = info ? [
    field("Pools", info.pools.join(", ")),
    field("Leader", `${info.leader} (${info.host}, pid ${info.pid})`),
    field("Replicas", replicaList(info.replicas)),
    field("Epoch", info.epoch),
    field("Leading since", ago(info.leading_since_unix_ns)),
    field("Endpoint", info.endpoint || "—"),
    field("Store", `${info.store} · cronoq ${info.version}`),
  ] : [field("Pools", "unknown")];
  const status = state === "serving" ? "serving" : "unavailable: it could not be asked";
  return h("article", { class: `shard ${state}`, dataset: { shard: title, state } },
    h("h3", null, `Shard ${title}`, info && info.number ? ` · #${info.number}` : ""),
    h("p", { class: "state" }, status), h("dl", null, details));
}

class PoolPanel {
  constructor(name) {
    this.backlog = new LineChart("Backlog", [
      { name: "pending", className: "s1" }, { name: "busy", className: "s2" }, { name: "capacity", className: "s3" }]);
    this.waits = new LineChart("Wait", [
      { name: "p50", className: "s1" }, { name: "p90", className: "s2" }, { name: "p99", className: "s3" }],
    { format: (v) => seconds(v) });
    this.workers = new LineChart("Workers", [
      { name: "desired", className: "s1" }, { name: "connected", className: "s2" }]);
    this.numbers = h("dl", { class: "numbers" });
    this.element = h("article", { class: "pool", dataset: { pool: name } }, h("h3", null, `Pool ${name}`),
      this.numbers, h("div", { class: "charts" }, this.backlog.element, this.waits.element, this.workers.element));
  }

  update(pool) {
    this.backlog.push([pool.pending, pool.busy, pool.capacity]);
    this.waits.push([pool.wait_p50_s, pool.wait_p90_s, pool.wait_p99_s]);
    this.workers.push([pool.desired, pool.workers_connected]);
    const byClass = pool.pending_by_class.map((count, i) => `${CLASSES[i]} ${count}`).join(" · ");
    replace(this.numbers,
      field("Capacity", `${pool.capacity} (busy ${pool.busy}, held ${pool.held})`),
      field("Pending", `${pool.pending}: ${byClass}`),
      field("Wait p50 / p90 / p99", `${seconds(pool.wait_p50_s)} / ${seconds(pool.wait_p90_s)} / ` +
        `${seconds(pool.wait_p99_s)}`),
      field("Workers desired / connected", `${pool.desired} / ${pool.workers_connected}`),
      field("Cost", number(pool.cost)),
      field("Priority adherence", percent(pool.priority_adherence)),
      field("Fixed-start hit rate", percent(pool.fixed_start_hit_rate)),
      field("Utilization", percent(pool.utilization)),
      field("Succeeded / failed", `${pool.succeeded} / ${pool.failed}`));
  }
}

export function mount(section) {
  const shardsBox = h("div", { class: "cards", id: "shards" });
  const totals = h("p", { class: "totals" });
  const poolsBox = h("div", { class: "pools", id: "pools" });
  const problem = h("p", { class: "error", role: "status" });
  section.append(h("h2", null, "Shards"), shardsBox, h("h2", null, "Pools"), totals, poolsBox, problem);
  const known = new Map(); // shard name -> last answer, so a missing shard keeps its last known pools
  const panels = new Map();

  return every(PERIOD_MS, async (signal) => {
    const [shards, snap] = await Promise.all([get("/v1/shards", null, signal), get("/v1/snapshot", null, signal)]);
    problem.textContent = "";
    for (const info of shards.shards) known.set(info.name, info);
    const missing = new Set([...shards.unavailable_shards, ...snap.unavailable_shards]);
    const names = [...new Set([...known.keys(), ...missing])].sort();
    replace(shardsBox, names.map((name) => shardCard(name, known.get(name),
      missing.has(name) ? "unavailable" : "serving")));
    replace(totals, `${snap.live_tasks} live tasks · ${snap.running} running · ${snap.pending} pending · ` +
      `${snap.workers_connected} workers · submitted ${snap.totals.submitted}, succeeded ${snap.totals.succeeded}, ` +
      `failed ${snap.totals.failed}`);
    const seen = new Set();
    for (const pool of snap.pools) {
      seen.add(pool.name);
      if (!panels.has(pool.name)) panels.set(pool.name, new PoolPanel(pool.name));
      panels.get(pool.name).update(pool);
    }
    replace(poolsBox, [...panels.keys()].sort().map((name) => {
      const panel = panels.get(name);
      panel.element.classList.toggle("stale", !seen.has(name));
      return panel.element;
    }));
  }, (error) => {
    problem.textContent = `Could not refresh: ${error.message}`;
  });
}
