"""The Lua scripts behind the shared state: each is one atomic step on the server.

Times come from the Redis server's clock (``TIME``), so routers on hosts whose
clocks differ agree on leases and windows. A script touches only keys under the
deployment's prefix; the slot script reads the other routers' slot hashes by name,
so the deployment must live on one Redis node (standalone or Sentinel, not Cluster).
"""

from __future__ import annotations

_NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS: routers, my slots, then the long-lived keys (epoch first).
# ARGV: router id, lease ms, state ttl ms, a fresh epoch id.
# Returns {epoch, live routers, 1 if this router's lease had lapsed (or never was)}.
HEARTBEAT = _NOW + """
local lease = tonumber(ARGV[2])
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
local lapsed = 0
if (not old) or tonumber(old) <= now then lapsed = 1 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * lease)
redis.call('PEXPIRE', KEYS[2], lease)
local epoch = redis.call('GET', KEYS[3])
if not epoch then
  epoch = ARGV[4]
  redis.call('SET', KEYS[3], epoch)
end
for i = 3, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
return {epoch, redis.call('ZCARD', KEYS[1]), lapsed}
"""

# KEYS: routers, my slots. ARGV: slots key prefix, router id, tenant, limit, lease ms.
# Counts the slots of live routers only (and always this router's own).
ACQUIRE_SLOT = _NOW + """
local used = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
for _, router in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  if router ~= ARGV[2] then
    used = used + tonumber(redis.call('HGET', ARGV[1] .. router, ARGV[3]) or '0')
  end
end
if used >= tonumber(ARGV[4]) then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""

# KEYS: my slots. ARGV: tenant.
RELEASE_SLOT = """
if tonumber(redis.call('HINCRBY', KEYS[1], ARGV[1], -1)) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

# Drops entries recorded at or before now - window; leaves the window total in `sum`.
# KEYS: window zset, amounts hash. ARGV[1]: window ms.
_EXPIRE = _NOW + """
local window = tonumber(ARGV[1])
local sum = tonumber(redis.call('HGET', KEYS[2], '_sum') or '0')
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - window)
for _, id in ipairs(old) do
  sum = sum - tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('HDEL', KEYS[2], id)
end
if #old > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
  redis.call('HSET', KEYS[2], '_sum', sum)
end
"""

# ARGV: window ms, reservation id, tokens, limit. Returns -1 when recorded, else the
# milliseconds until enough old entries leave the window for it to fit.
RESERVE_TOKENS = _EXPIRE + """
local tokens, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
if sum + tokens <= limit then
  redis.call('ZADD', KEYS[1], now, ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[2], tokens, '_sum', sum + tokens)
  redis.call('PEXPIRE', KEYS[1], window + 1000)
  redis.call('PEXPIRE', KEYS[2], window + 1000)
  return -1
end
local excess = sum + tokens - limit
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #entries, 2 do
  excess = excess - tonumber(redis.call('HGET', KEYS[2], entries[i]) or '0')
  if excess <= 0 then return math.max(tonumber(entries[i + 1]) + window - now, 0) end
end
return window
"""

# ARGV: window ms, reservation id, tokens admitted, tokens reserved, tokens produced.
# A reservation still in the window keeps the admitted tokens at its time and the
# produced ones are recorded now; for one that left it, the tokens above what was
# reserved are recorded now.
SETTLE_TOKENS = _EXPIRE + """
local held = redis.call('HGET', KEYS[2], ARGV[2])
local extra
if held then
  sum = sum + tonumber(ARGV[3]) - tonumber(held)
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  extra = tonumber(ARGV[5])
else
  extra = tonumber(ARGV[3]) + tonumber(ARGV[5]) - tonumber(ARGV[4])
end
if extra > 0 then
  local id = ARGV[2] .. ':produced'
  redis.call('ZADD', KEYS[1], now, id)
  redis.call('HSET', KEYS[2], id, extra)
  sum = sum + extra
  redis.call('PEXPIRE', KEYS[1], window + 1000)
  redis.call('PEXPIRE', KEYS[2], window + 1000)
end
redis.call('HSET', KEYS[2], '_sum', sum)
return 0
"""

# ARGV: window ms. Returns the window total.
TOKENS_IN_WINDOW = _EXPIRE + """
return sum
"""

# KEYS: workers, version. ARGV: worker id, config JSON, cap. Returns the new version,
# or -1 when the registry is full.
ADD_WORKER = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
   and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return -1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('INCR', KEYS[2])
"""

# KEYS: workers, version. ARGV: worker id. Returns the new version.
REMOVE_WORKER = """
redis.call('HDEL', KEYS[1], ARGV[1])
return redis.call('INCR', KEYS[2])
"""

# KEYS: prefixes. ARGV: field, token bytes, cap. Returns 1 if stored, 0 if known,
# -1 when full.
ADD_PREFIX = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS: routers, my flow totals. ARGV: flow totals key prefix, router id, lease ms,
# then flow, total pairs. Replaces this router's totals (TTL: the lease) and returns
# the flow, total pairs of every other live router.
SYNC_FLOW_SHARES = _NOW + """
redis.call('DEL', KEYS[2])
for i = 4, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local out = {}
for _, router in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  if router ~= ARGV[2] then
    for _, v in ipairs(redis.call('HGETALL', ARGV[1] .. router)) do table.insert(out, v) end
  end
end
return out
"""
