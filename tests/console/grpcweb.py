"""gRPC-Web from inside the browser: the page's own ``fetch`` speaks it, frames and protobuf made
by hand (a few fields of a few messages), so that Chromium itself does the CORS preflight, reads
the exposed ``grpc-status`` header and streams Watch across shards.

The page is one of the HTTP listener's JSON answers (``/healthz``), so its origin is the HTTP
endpoint, which the cluster lists in ``[server.grpc_web] allowed_origins``; the calls go to the
gRPC endpoint (another port: another origin).
"""

from __future__ import annotations

PROTOBUF = """
const frame = (bytes) => {
  const out = new Uint8Array(5 + bytes.length);
  new DataView(out.buffer).setUint32(1, bytes.length);
  out.set(bytes, 5);
  return out;
};
const varint = (bytes, at) => {
  let value = 0n, shift = 0n, byte;
  do { byte = bytes[at++]; value |= BigInt(byte & 0x7f) << shift; shift += 7n; } while (byte & 0x80);
  return [value, at];
};
// {field number: [values]} of one message: varints as BigInt, length-delimited as bytes.
const fields = (bytes) => {
  const out = {};
  let at = 0;
  while (at < bytes.length) {
    let key;
    [key, at] = varint(bytes, at);
    const number = Number(key >> 3n), type = Number(key & 7n);
    let value;
    if (type === 0) { [value, at] = varint(bytes, at); }
    else if (type === 2) {
      let size;
      [size, at] = varint(bytes, at);
      value = bytes.slice(at, at + Number(size));
      at += Number(size);
    }
    else if (type === 1) { value = bytes.slice(at, at + 8); at += 8; }
    else if (type === 5) { value = bytes.slice(at, at + 4); at += 4; }
    else throw new Error(`wire type ${type}`);
    (out[number] ||= []).push(value);
  }
  return out;
};
const text = (bytes) => new TextDecoder().decode(bytes);
const headers = (token) => ({"content-type": "application/grpc-web+proto", "x-grpc-web": "1",
                             authorization: `Bearer ${token}`});
"""

SNAPSHOT = (
    "async ({url, token}) => {"
    + PROTOBUF
    + """
  const response = await fetch(`${url}/cronoq.v1.Admin/Snapshot`,
                               {method: "POST", headers: headers(token), body: frame(new Uint8Array())});
  const body = new Uint8Array(await response.arrayBuffer());
  const frames = [];
  for (let at = 0; at < body.length;) {
    const size = new DataView(body.buffer, at + 1, 4).getUint32(0);
    frames.push({trailer: (body[at] & 0x80) !== 0, data: body.slice(at + 5, at + 5 + size)});
    at += 5 + size;
  }
  // A refusal comes as "trailers only": grpc-status in the headers, no frame.
  const [message] = frames.filter((f) => !f.trailer);
  const pools = message ? (fields(message.data)[1] || []).map((pool) => text(fields(pool)[1][0])) : [];
  const trailer = frames.find((f) => f.trailer);
  return {status: response.status, grpcStatus: response.headers.get("grpc-status"), pools,
          trailer: trailer ? text(trailer.data) : ""};
}"""
)
"""Admin.Snapshot of every shard; answers the pool names and the trailer."""

WATCH = (
    "async ({url, token, key}) => {"
    + PROTOBUF
    + """
  // WatchRequest{all_transitions: true}: field 4, varint 1.
  const response = await fetch(`${url}/cronoq.v1.Tasks/Watch`,
                               {method: "POST", headers: headers(token), body: frame(new Uint8Array([0x20, 1]))});
  window.watchOpen = true;  // the server answers its headers once every shard has subscribed
  const reader = response.body.getReader();
  let buffer = new Uint8Array();
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return {error: "the stream ended"};
    const joined = new Uint8Array(buffer.length + value.length);
    joined.set(buffer); joined.set(value, buffer.length); buffer = joined;
    while (buffer.length >= 5) {
      const size = new DataView(buffer.buffer, buffer.byteOffset + 1, 4).getUint32(0);
      if (buffer.length < 5 + size) break;
      const flag = buffer[0], data = buffer.slice(5, 5 + size);
      buffer = buffer.slice(5 + size);
      if (flag & 0x80) return {error: text(data)};
      const event = fields(data);  // StatusEvent: id 1, pool 2, key 3, status 4
      if (event[3] && text(event[3][0]) === key && event[4][0] === 6n) {  // TASK_STATUS_SUCCEEDED
        reader.cancel();
        return {id: event[1][0].toString(), pool: text(event[2][0])};
      }
    }
  }
}"""
)
"""Watch over every shard until the task with ``key`` succeeded; answers its id and pool."""
