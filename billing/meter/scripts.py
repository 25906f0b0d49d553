"""The Redis Lua scripts behind admission and settlement.

Each check-and-update runs as one script so that any number of gateway processes sharing
Redis see a single serial order: that is what bounds an org's overrun to one request's
worst case. Times come from Redis's own clock (TIME), never from the gateways'.
Money travels as decimal strings and is only added with HINCRBY, so Lua's doubles are
used for comparisons only (exact below 2^53 nano-USD, about $9M per org and period).
"""

from __future__ import annotations

# An org's budget hash counts budget units: the plan's allowance is consumed at allowance
# cost (list / the promotion's multiplier) until it runs out, then overage counts its list
# cost against the overage budget; the cap is allowance plus overage budget. BUDGET_UNITS
# is billing.allowance.budget_units: what a request of list cost `list` adds after `used`
# (its allowance cost list * den / num is exact, the price book guarantees it; the values
# stay far below 2^53, where Lua's doubles are exact).
BUDGET_UNITS = """
local function budget_units(list, num, den, included, used)
  local left = included - used
  if left <= 0 then return list end
  local cost = list * den / num
  if cost <= left then return cost end
  return left + list - math.ceil(left * num / den)
end
"""

# Redis's clock in microseconds (`now`), the rate limits' window, and the GCRA step: what
# charging `cost` to a bucket of `limit` per window would make of its stored state.
# Returns {new state, fits, left after, left before, wait before, wait past the window}.
CLOCK_AND_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local function gcra(stored, limit, cost)
  local interval = window / limit
  local tat = tonumber(stored or '0')
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
"""

# `period`: the UTC calendar month of Redis's clock (civil-from-days), from CLOCK_AND_GCRA's t.
PERIOD_OF_NOW = """
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
"""

# The org's budget keys of the period (KEYS 4-6 of ADMIT and LEASE), with the reservations
# whose gateway never settled them (it died mid-request) released (RELEASE, whole).
BUDGET_RECLAIMED = """
local bkey, rkey, akey = KEYS[4], KEYS[5], KEYS[6]
for _, id in ipairs(redis.call('ZRANGEBYSCORE', rkey, '-inf', now, 'LIMIT', 0, 100)) do
  release(bkey, rkey, akey, id, -1)
  redis.call('ZREM', rkey, id)
end
"""


def budget_of_the_period(period_arg: int) -> str:
    """Lua, after a GCRA check (``req``, ``tok``): the period the gateway named in
    ``ARGV[period_arg]`` checked against Redis's ('period' answered if they differ), the
    budget's expired reservations released, and its ``budget``, ``used`` and ``reserved``
    read."""
    return (
        PERIOD_OF_NOW
        + f"""
if period ~= ARGV[{period_arg}] then
  return {{'period', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), period}}
end
"""
        + BUDGET_RECLAIMED
        + """
local budget = redis.call('HMGET', bkey, 'used', 'reserved')
local used = tonumber(budget[1] or '0')
local reserved = tonumber(budget[2] or '0')
"""
    )


# The first use of an org's period (`budget` read before it): its keys outlive the month,
# then go.
BUDGET_KEPT = """
if not budget[1] and not budget[2] then
  local keep_s = 70 * 86400
  redis.call('EXPIRE', bkey, keep_s)
  redis.call('EXPIRE', akey, keep_s)
  redis.call('EXPIRE', rkey, keep_s)
end
"""

# `release(bkey, rkey, akey, id, part)`: `part` of the reservation `id` given back to the
# budget (a negative part, or one at least what it holds: all of it, and its entries go,
# with a lease's last grant and return marks, `id#g` and `id#r`). A reservation already
# released (settled, expired) gives back nothing. An amount of 0 is never subtracted
# as '-0' (which HINCRBY refuses).
RELEASE = """
local function release(bkey, rkey, akey, id, part)
  local held = redis.call('HGET', akey, id)
  if not held then return end
  local amount = tonumber(held)
  if part >= 0 and part < amount then
    if part > 0 then
      redis.call('HINCRBY', bkey, 'reserved', string.format('%d', -part))
      redis.call('HINCRBY', akey, id, string.format('%d', -part))
    end
    return
  end
  if amount ~= 0 then
    redis.call('HINCRBY', bkey, 'reserved', string.format('%d', -amount))
  end
  redis.call('HDEL', akey, id, id .. '#g', id .. '#r')
  redis.call('ZREM', rkey, id)
end
"""

# Keys: 1 the API key's rate-limit hash (GCRA states of rpm and tpm), 2 org suspended,
#       3 customer suspended, then the org's budget of the period the gateway expects:
#       4 its hash (used, reserved), 5 its reservations' expiries, 6 their amounts.
# Argv: 1 rpm, 2 tpm, 3 tokens, 4 worst list cost nano, 5 period cap (budget units),
#       6 request id, 7 reservation ttl s, 8 the period of keys 4-6, 9 and 10 the
#       promotion's multiplier (numerator, denominator), 11 the plan's allowance nano.
# The reservation is the worst case's budget units as if every reservation held were
# already used: an upper bound of what the request adds, whatever settles first.
# Every key is declared (a Redis Cluster requires it, to route the call and to move the
# keys during a resharding); so the gateway names the period, and the script answers
# 'period' with Redis's own when they differ (a month boundary between the two clocks).
# Few redis.call()s on purpose: each costs a few microseconds, and this runs per request.
ADMIT = (
    BUDGET_UNITS
    + RELEASE
    + CLOCK_AND_GCRA
    + """
local state = redis.call('HMGET', KEYS[1], 'rpm', 'tpm')
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local req = gcra(state[1], rpm, 1)
local tok = gcra(state[2], tpm, tokens)
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then
  return {'suspended', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5])}
end
if tokens > tpm then
  return {'too_large', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5])}
end
if not req[2] or not tok[2] then
  local wait = 0
  if not req[2] then wait = req[6] end
  if not tok[2] and tok[6] > wait then wait = tok[6] end
  return {'rate', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), math.ceil(wait)}
end
"""
    + budget_of_the_period(8)
    + """
local cap = tonumber(ARGV[5])
local units = budget_units(tonumber(ARGV[4]), tonumber(ARGV[9]), tonumber(ARGV[10]),
  tonumber(ARGV[11]), used + reserved)
local amount = string.format('%d', units)
if redis.call('HSETNX', akey, ARGV[6], amount) == 1 then
  if used + reserved + units > cap then
    redis.call('HDEL', akey, ARGV[6])
    return {'quota', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), period}
  end
  redis.call('HINCRBY', bkey, 'reserved', amount)
  redis.call('ZADD', rkey, now + tonumber(ARGV[7]) * 1000000, ARGV[6])
  reserved = reserved + units
else  -- admitted before (a retried call): what it holds
  amount = redis.call('HGET', akey, ARGV[6])
end
"""
    + BUDGET_KEPT
    + """
redis.call('HSET', KEYS[1], 'rpm', string.format('%d', req[1]), 'tpm', string.format('%d', tok[1]))
redis.call('PEXPIRE', KEYS[1], 120000)
return {'ok', req[3], math.ceil(req[1] - now), tok[3], math.ceil(tok[1] - now), period,
  string.format('%d', cap - used - reserved), amount}
"""
)

# Settles a batch of requests (billing/meter/settlement.py), each exactly once.
# Keys: five per request: its settled marker, its shard's usage stream, and its org's
#       budget of the period: hash, reservations' expiries, their amounts. (On a Redis
#       Cluster a batch holds one shard's requests: every key is in one slot.)
# Argv: 1 marker ttl s, then seven per request: its reservation's id (the request id, or
#       the id of the lease it was admitted on), the part of that reservation it releases
#       (-1: all of it; a lease's request releases what it took of the lease), its list
#       cost nano, its promotion's multiplier (numerator, denominator), its plan's
#       allowance nano, and its event json. It adds BUDGET_UNITS to the budget's used.
# Returns, per request, 1 if this call settled it, 0 if it was settled before, or the
# error reply that stopped it ("OOM ...", "WRONGTYPE ..."): one request's failure is not
# the batch's. Redis refusing writes (OOM, READONLY) fails a request's first write, its
# marker, so such a request applied nothing and can be sent again.
SETTLE = (
    BUDGET_UNITS
    + RELEASE
    + """
local function settle(k, a)
  if not redis.call('SET', KEYS[k], '1', 'NX', 'EX', ARGV[1]) then
    return 0
  end
  local bkey, akey = KEYS[k + 2], KEYS[k + 4]
  release(bkey, KEYS[k + 3], akey, ARGV[a], tonumber(ARGV[a + 1]))
  local used = tonumber(redis.call('HGET', bkey, 'used') or '0')
  local units = budget_units(tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), used)
  redis.call('HINCRBY', bkey, 'used', string.format('%d', units))
  redis.call('EXPIRE', bkey, 70 * 86400)
  redis.call('XADD', KEYS[k + 1], '*', 'event', ARGV[a + 6])
  return 1
end
local outcomes = {}
for i = 1, #KEYS / 5 do
  local ok, result = pcall(settle, (i - 1) * 5 + 1, (i - 1) * 7 + 2)
  if ok then
    outcomes[i] = result
  else
    if type(result) == 'table' then result = result.err end
    outcomes[i] = tostring(result)
  end
end
return outcomes
"""
)

# Keys: the reservation sorted set of each reservation renewed (one key per entry).
# Argv: 1 reservation ttl s, 2.. the request id of each entry, in the order of the keys.
# XX: a reservation already released (settled, or expired while Redis was away) is not
# brought back; its money is no longer held, so renewing it would hold nothing.
RENEW = """
local t = redis.call('TIME')
local expiry = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2])
  + tonumber(ARGV[1]) * 1000000)
local renewed = 0
for i, key in ipairs(KEYS) do
  renewed = renewed + redis.call('ZADD', key, 'XX', 'CH', expiry, ARGV[i + 1])
end
return renewed
"""

# Grants a lease (meter/leases.py), or adds to one: `n` requests and `tokens` tokens
# charged to the key's rate limits, `units` of the org's budget reserved under the lease's
# id, after ADMIT's checks (suspension, rate limits, the period, the cap) for the whole.
# Keys: ADMIT's. Argv: 1 rpm, 2 tpm, 3 n, 4 tokens, 5 units, 6 period cap (budget units),
#       7 the lease's id, 8 reservation ttl s, 9 the period of keys 4-6, 10 the grant's
#       number in the lease (from 1: a grant sent again after its reply was lost is
#       applied once; `id#g` keeps the last one applied).
# Returns ADMIT's reply without its last field: status, requests left and their reset,
# tokens left and their reset, the period, budget units left (once the lease is held);
# or {'again'} for a grant applied before.
LEASE = (
    RELEASE
    + CLOCK_AND_GCRA
    + """
local applied = redis.call('HGET', KEYS[6], ARGV[7] .. '#g')
if applied and tonumber(applied) >= tonumber(ARGV[10]) then return {'again'} end
local state = redis.call('HMGET', KEYS[1], 'rpm', 'tpm')
local req = gcra(state[1], tonumber(ARGV[1]), tonumber(ARGV[3]))
local tok = gcra(state[2], tonumber(ARGV[2]), tonumber(ARGV[4]))
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then
  return {'suspended', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5])}
end
if not req[2] or not tok[2] then
  return {'rate', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), 0}
end
"""
    + budget_of_the_period(9)
    + """
local cap = tonumber(ARGV[6])
local units = tonumber(ARGV[5])
if used + reserved + units > cap then
  return {'quota', req[4], math.ceil(req[5]), tok[4], math.ceil(tok[5]), period}
end
redis.call('HINCRBY', bkey, 'reserved', ARGV[5])
redis.call('HINCRBY', akey, ARGV[7], ARGV[5])
redis.call('HSET', akey, ARGV[7] .. '#g', ARGV[10])
redis.call('ZADD', rkey, now + tonumber(ARGV[8]) * 1000000, ARGV[7])
"""
    + BUDGET_KEPT
    + """
redis.call('HSET', KEYS[1], 'rpm', string.format('%d', req[1]), 'tpm', string.format('%d', tok[1]))
redis.call('PEXPIRE', KEYS[1], 120000)
return {'ok', req[3], math.ceil(req[1] - now), tok[3], math.ceil(tok[1] - now), period,
  string.format('%d', cap - used - reserved - units)}
"""
)

# Gives back what a lease holds unused, once: `units` of its reservation released (what
# its requests in flight took stays held until they settle), and its unused requests and
# tokens refunded to the key's rate limits (never below an empty bucket: a refund cannot
# lend the key what it has not used). A lease returned before (`id#r`), or no longer
# held (expired), gives back nothing: a return sent again after its reply was lost is a
# no-op, and so is one whose reservation the TTL has released.
# Keys: 1 the key's rate-limit hash, 2 the org's budget hash of the period, 3 its
#       reservations' expiries, 4 their amounts.
# Argv: 1 rpm, 2 tpm, 3 requests, 4 tokens, 5 units, 6 the lease's id.
# Returns 1 if it gave back, else 0.
RETURN_LEASE = (
    RELEASE
    + """
if not redis.call('HGET', KEYS[4], ARGV[6]) or redis.call('HGET', KEYS[4], ARGV[6] .. '#r') then
  return 0
end
redis.call('HSET', KEYS[4], ARGV[6] .. '#r', '1')
release(KEYS[2], KEYS[3], KEYS[4], ARGV[6], tonumber(ARGV[5]))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local state = redis.call('HMGET', KEYS[1], 'rpm', 'tpm')
local function refund(stored, limit, cost)
  local tat = tonumber(stored or '0') - cost * window / limit
  if tat < now then tat = now end
  return string.format('%d', tat)
end
redis.call('HSET', KEYS[1],
  'rpm', refund(state[1], tonumber(ARGV[1]), tonumber(ARGV[3])),
  'tpm', refund(state[2], tonumber(ARGV[2]), tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[1], 120000)
return 1
"""
)
