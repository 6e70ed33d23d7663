// The HTTP API of the node that served this page (same origin). The token lives in this tab's
// sessionStorage and leaves it only in the authorization header: never in a URL, never logged.

const TOKEN_KEY = "cronoq.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export const session = {
  token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  set(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
  },
};

function url(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value === undefined || value === null || value === "" || value === false) continue;
    params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

function request(method, path, query, signal, token) {
  const headers = { Accept: "application/json" };
  const credential = token === undefined ? session.token() : token;
  if (credential) headers.Authorization = `Bearer ${credential}`;
  return fetch(url(path, query), {
    method, headers, signal, cache: "no-store", credentials: "omit", redirect: "error", referrerPolicy: "no-referrer",
  });
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: the status says enough
  }
  const message = body && typeof body.error === "string" ? body.error : `HTTP ${response.status}`;
  return new ApiError(response.status, body && body.code, message);
}

// One call: the JSON answer, or ApiError.
export async function call(method, path, { query, signal, token } = {}) {
  const response = await request(method, path, query, signal, token);
  if (!response.ok) throw await failure(response);
  return response.json();
}

export const get = (path, query, signal) => call("GET", path, { query, signal });

// A newline-delimited JSON stream: onLine(object) for each line, until it ends or signal aborts.
export async function stream(path, query, onLine, signal) {
  const response = await request("GET", path, query, signal);
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.trim()) onLine(JSON.parse(line));
    }
  }
}

// Tasks are named in the console's own links by their decimal id only.
export function isTaskId(text) {
  return typeof text === "string" && /^[0-9]{1,20}$/.test(text);
}
