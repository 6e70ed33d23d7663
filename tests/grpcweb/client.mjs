// A gRPC-Web client made with Connect-ES (@connectrpc/connect-web), run by Node.js against a real
// cronoq cluster by tests/server/test_grpc_web_client.py. It reads one JSON scenario from argv[2]:
// {"url": ..., "token": ..., "pools": [...]} and prints one JSON line of what it saw.
import { createClient, ConnectError } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Tasks, Admin } from "./gen/cronoq/v1/cronoq_pb.js";
import { Console } from "./gen/cronoq/console/v1/console_pb.js";

const scenario = JSON.parse(process.argv[2]);
const transport = createGrpcWebTransport({ baseUrl: scenario.url, useBinaryFormat: true });
const auth = { headers: { authorization: `Bearer ${scenario.token}` } };
const tasks = createClient(Tasks, transport);
const admin = createClient(Admin, transport);
const console_ = createClient(Console, transport);
const out = {};

// Watch every pool (both shards), then submit one task per pool: the terminal events of both
// shards must come through the one stream.
const abort = new AbortController();
const seen = [];
const watching = (async () => {
  try {
    for await (const event of tasks.watch({ pools: [] }, { ...auth, signal: abort.signal })) {
      seen.push({ id: String(event.id), pool: event.pool, status: event.status });
      if (seen.length >= scenario.pools.length) break;
    }
  } catch (err) {
    if (!(err instanceof ConnectError && abort.signal.aborted)) throw err;
  }
})();
await new Promise((resolve) => setTimeout(resolve, 500)); // the subscriptions of both shards
out.submitted = [];
for (const pool of scenario.pools) {
  const answer = await tasks.submit({ task: { pool, kind: "node", payload: new TextEncoder().encode("hi") } }, auth);
  out.submitted.push({ pool, id: String(answer.id) });
}
const timer = setTimeout(() => abort.abort(), 20000);
await watching;
clearTimeout(timer);
out.watched = seen;

// Get of a task of the other shard (forwarded), a snapshot of both shards, a search.
const other = out.submitted[out.submitted.length - 1];
const info = await tasks.get({ task: { target: { case: "id", value: BigInt(other.id) } } }, auth);
out.get = { id: String(info.id), pool: info.pool, status: info.status };
const snapshot = await admin.snapshot({}, auth);
out.snapshot_pools = snapshot.pools.map((pool) => pool.name).sort();
const found = await console_.searchTasks({ list: { limit: 10 }, kinds: ["node"], newestFirst: true }, auth);
out.search = found.tasks.map((task) => String(task.id));

// Refusals: a bad token, and the bidirectional stream.
try {
  await admin.snapshot({}, { headers: { authorization: "Bearer not-a-token-of-this-cluster" } });
  out.bad_token = "accepted";
} catch (err) {
  out.bad_token = err instanceof ConnectError ? err.code : String(err);
}
console.log(JSON.stringify(out));
