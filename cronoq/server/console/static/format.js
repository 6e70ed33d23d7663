// Numbers and times as people read them. Times arrive as Unix nanoseconds in decimal strings.

export function nsToDate(ns) {
  if (ns === undefined || ns === null || ns === "") return null;
  return new Date(Number(BigInt(ns) / 1000000n));
}

export function time(ns) {
  const date = nsToDate(ns);
  if (!date) return "";
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}.${pad(date.getMilliseconds(), 3)}`;
}

export function seconds(value) {
  if (value === undefined || value === null || !Number.isFinite(value)) return "";
  if (value === 0) return "0";
  if (value < 0.001) return `${(value * 1e6).toFixed(0)} µs`;
  if (value < 1) return `${(value * 1000).toFixed(1)} ms`;
  if (value < 120) return `${value.toFixed(2)} s`;
  if (value < 7200) return `${(value / 60).toFixed(1)} min`;
  return `${(value / 3600).toFixed(1)} h`;
}

export function ago(ns) {
  const date = nsToDate(ns);
  if (!date) return "";
  const delta = (Date.now() - date.getTime()) / 1000;
  return delta >= 0 ? `${seconds(delta)} ago` : `in ${seconds(-delta)}`;
}

export function percent(value) {
  return Number.isFinite(value) ? `${(value * 100).toFixed(1)} %` : "";
}

export function number(value, digits = 2) {
  if (!Number.isFinite(value)) return "";
  return Number.isInteger(value) ? String(value) : value.toFixed(digits);
}

export function bytes(count) {
  if (count < 1024) return `${count} B`;
  if (count < 1024 * 1024) return `${(count / 1024).toFixed(1)} KiB`;
  return `${(count / 1024 / 1024).toFixed(1)} MiB`;
}

// A datetime-local input's value (local time) as Unix nanoseconds, or "" when empty.
export function localToNs(value) {
  if (!value) return "";
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? (BigInt(ms) * 1000000n).toString() : "";
}

export function nsToLocal(ns) {
  const date = nsToDate(ns);
  if (!date) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:` +
    `${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

export const TERMINAL = new Set(["succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"]);
export const STATUSES = ["scheduled", "blocked", "ready", "running", "retrying", "succeeded", "failed",
  "dead_lettered", "cancelled", "skipped", "missed", "shed"];
