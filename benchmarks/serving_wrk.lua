-- wrk's side of `python -m benchmarks.serving`: POST /v1/score with JSON bodies and an API key.
--
--   FB_IDS=FILE FB_KEYS=KEY1,KEY2 FB_THREADS=T FB_MODE=single|batch [FB_BATCH=100] [FB_SEED=1] \
--     wrk -t T -c C -d 10s -s benchmarks/serving_wrk.lua https://127.0.0.1:PORT/v1/score
--
-- single: one id per request, each thread taking the ids of FILE (one a line) in turn from its
-- own offset, so with FB_IDS the ids the service has never been asked, every request is a
-- fresh id and pays the membership round (ids run out: "wrapped" in the summary says so).
-- batch: FB_BATCH random ids of FILE per request. Thread k sends key k of FB_KEYS (modulo).
-- The summary is one line, "FBWRK {json}": requests, non-2xx, socket errors, latency in ms.

local threads = {}

function setup(thread)
   thread:set("number", #threads)
   table.insert(threads, thread)
end

function init(args)
   ids = {}
   for line in io.lines(os.getenv("FB_IDS")) do
      if #line > 0 then ids[#ids + 1] = line end
   end
   mode = os.getenv("FB_MODE") or "single"
   batch = tonumber(os.getenv("FB_BATCH") or "100")
   local keys = {}
   for key in string.gmatch(os.getenv("FB_KEYS") or "", "[^,]+") do keys[#keys + 1] = key end
   stride = tonumber(os.getenv("FB_THREADS") or "1")  -- wrk's -t: each thread's state is its own
   nextid = number
   wrapped = 0
   math.randomseed(tonumber(os.getenv("FB_SEED") or "1") * 1000 + number)
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   if #keys > 0 then
      wrk.headers["Authorization"] = "Bearer " .. keys[number % #keys + 1]
   end
end

local function quoted(ident)
   return '"' .. ident:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
end

function request()
   local body
   if mode == "single" then
      if nextid >= #ids then
         wrapped = 1
         nextid = nextid % #ids
      end
      body = '{"ids":[' .. quoted(ids[nextid + 1]) .. ']}'
      nextid = nextid + stride
   else
      local picked = {}
      for k = 1, batch do picked[k] = quoted(ids[math.random(#ids)]) end
      body = '{"ids":[' .. table.concat(picked, ",") .. ']}'
   end
   return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
   local wrapped_any = 0
   for _, thread in ipairs(threads) do
      if thread:get("wrapped") == 1 then wrapped_any = 1 end
   end
   local e = summary.errors
   io.write(string.format(
      'FBWRK {"requests": %d, "seconds": %.3f, "non_2xx": %d, "socket_errors": %d, ' ..
      '"wrapped": %s, "p50_ms": %.3f, "p90_ms": %.3f, "p99_ms": %.3f, "max_ms": %.3f, ' ..
      '"mean_ms": %.3f}\n',
      summary.requests, summary.duration / 1e6, e.status,
      e.connect + e.read + e.write + e.timeout, wrapped_any == 1 and "true" or "false",
      latency:percentile(50) / 1e3, latency:percentile(90) / 1e3,
      latency:percentile(99) / 1e3, latency.max / 1e3, latency.mean / 1e3))
end
