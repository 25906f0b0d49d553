"""The Redis Lua scripts behind admission and settlement.

Each check-and-update runs as one script so that any number of gateway processes sharing
Redis see a single serial order: that is what bounds an org's overrun to one request's
worst case. Times come from Redis's own clock (TIME), never from the gateways'.
Money travels as decimal strings and is only added with HINCRBY, so Lua's doubles are
used for comparisons only (exact below 2^53 nano-USD, about $9M per org and period).
"""

from __future__ import annotations

# Keys: 1 rpm GCRA, 2 tpm GCRA, 3 org suspended, 4 customer suspended.
# Argv: 1 rpm, 2 tpm, 3 tokens, 4 worst nano, 5 period cap nano, 6 request id,
#       7 reservation ttl s, 8 budget key prefix.
ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if redis.call('EXISTS', KEYS[3]) == 1 or redis.call('EXISTS', KEYS[4]) == 1 then
  return {'suspended'}
end
local window = 60000000
local function gcra(key, limit, cost)
  local interval = window / limit
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then tat = now end
  local new_tat = tat + cost * interval
  return {
    new_tat,
    new_tat - now <= window,
    math.floor((window - (new_tat - now)) / interval),
    math.floor((window - (tat - now)) / interval),
    tat - now,
    new_tat - now - window,
  }
end
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local req = gcra(KEYS[1], rpm, 1)
local tok = gcra(KEYS[2], tpm, tokens)
if tokens > tpm then
  return {'too_large', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5])}
end
if not req[2] or not tok[2] then
  local wait = 0
  if not req[2] then wait = req[6] end
  if not tok[2] and tok[6] > wait then wait = tok[6] end
  return {'rate', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), math.ceil(wait)}
end
-- The period is the UTC calendar month of Redis's clock (civil-from-days).
local z = math.floor(tonumber(t[1]) / 86400) + 719468
local era = math.floor(z / 146097)
local doe = z - era * 146097
local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
  - math.floor(doe / 146096)) / 365)
local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
local mp = math.floor((5 * doy + 2) / 153)
local month = mp < 10 and mp + 3 or mp - 9
local year = yoe + era * 400
if month <= 2 then year = year + 1 end
local period = string.format('%04d-%02d', year, month)
local bkey = ARGV[8] .. period
local rkey = bkey .. ':resv'
local akey = bkey .. ':resv-amount'
-- Release reservations whose gateway never settled them (it died mid-request).
for _, id in ipairs(redis.call('ZRANGEBYSCORE', rkey, '-inf', now, 'LIMIT', 0, 100)) do
  local amount = redis.call('HGET', akey, id)
  if amount then redis.call('HINCRBY', bkey, 'reserved', '-' .. amount) end
  redis.call('HDEL', akey, id)
  redis.call('ZREM', rkey, id)
end
local used = tonumber(redis.call('HGET', bkey, 'used') or '0')
local reserved = tonumber(redis.call('HGET', bkey, 'reserved') or '0')
local cap = tonumber(ARGV[5])
if redis.call('HEXISTS', akey, ARGV[6]) == 0 then
  if used + reserved + tonumber(ARGV[4]) > cap then
    return {'quota', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), period}
  end
  redis.call('HINCRBY', bkey, 'reserved', ARGV[4])
  redis.call('HSET', akey, ARGV[6], ARGV[4])
  redis.call('ZADD', rkey, now + tonumber(ARGV[7]) * 1000000, ARGV[6])
  reserved = reserved + tonumber(ARGV[4])
end
local keep_s = 70 * 86400
redis.call('EXPIRE', bkey, keep_s)
redis.call('EXPIRE', akey, keep_s)
redis.call('EXPIRE', rkey, keep_s)
redis.call('SET', KEYS[1], string.format('%d', req[1]), 'PX', 120000)
redis.call('SET', KEYS[2], string.format('%d', tok[1]), 'PX', 120000)
return {'ok', req[3], math.ceil(req[1] - now), tok[3], math.ceil(tok[1] - now), period,
  string.format('%d', cap - used - reserved)}
"""

# Keys: 1 usage stream, 2 settled marker of the request.
# Argv: 1 budget key prefix, 2 period, 3 request id, 4 allowance consumed nano,
#       5 event json, 6 marker ttl s.
SETTLE = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[6]) then
  return 0
end
local bkey = ARGV[1] .. ARGV[2]
local akey = bkey .. ':resv-amount'
local amount = redis.call('HGET', akey, ARGV[3])
if amount then
  redis.call('HINCRBY', bkey, 'reserved', '-' .. amount)
  redis.call('HDEL', akey, ARGV[3])
  redis.call('ZREM', bkey .. ':resv', ARGV[3])
end
redis.call('HINCRBY', bkey, 'used', ARGV[4])
redis.call('EXPIRE', bkey, 70 * 86400)
redis.call('XADD', KEYS[1], '*', 'event', ARGV[5])
return 1
"""
