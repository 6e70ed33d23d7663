-- wrk script of producer_bench.py's http_wrk_c64 case: POST /v1/tasks with a JSON task whose key
-- is unique per request (the thread's number and a counter), counting answers by status.
-- At the end it prints one line "wrk-result {...}" of JSON for the bench to read.

local threads = {}
local next_thread = 0

function setup(thread)
  thread:set("thread_number", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

function init(args)
  sent = 0
  statuses = {}
  prefix = string.format('{"pool":"%s","key":"wrk-%s-%d-', args[1] or "default", args[2] or "run", thread_number)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  sent = sent + 1
  return wrk.format(nil, nil, nil, prefix .. sent .. '","payload":' .. sent .. "}")
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local counts = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      counts[status] = (counts[status] or 0) + n
    end
  end
  local parts = {}
  for status, n in pairs(counts) do
    table.insert(parts, string.format('"%d":%d', status, n))
  end
  local errors = summary.errors
  io.write(string.format(
    'wrk-result {"statuses":{%s},"duration_us":%d,"requests":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,'
      .. '"socket_errors":%d}\n',
    table.concat(parts, ","), summary.duration, summary.requests, latency:percentile(50),
    latency:percentile(99), latency.max, errors.connect + errors.read + errors.write + errors.timeout))
end
