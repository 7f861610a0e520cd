-- Cycles through pre-built heartbeat bodies (one JSON per line of BODIES_FILE), one member
-- per request, each wrk thread starting at its own offset.
local bodies = {}
local counter = 0
local path = os.getenv("BENCH_PATH")
local key = os.getenv("BENCH_KEY")

for line in io.lines(os.getenv("BODIES_FILE")) do
  bodies[#bodies + 1] = line
end

local thread_no = 0
function setup(thread)
  thread:set("offset", thread_no * 500)
  thread_no = thread_no + 1
end

function init(args)
  counter = offset or 0
end

function request()
  counter = counter + 1
  local body = bodies[(counter % #bodies) + 1]
  return wrk.format("POST", path, {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. key,
  }, body)
end
