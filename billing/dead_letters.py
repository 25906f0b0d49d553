"""The usage stream's dead letters: list them, and send them back through the ledger.

An entry is dead-lettered when the consumer could not write it (unparseable, rejected by
the database, or delivered too many times, e.g. while the ledger kept crashing). Once
the cause is fixed an operator replays it: one Lua script checks that the entry is still
there, appends its original fields to the usage stream, and only then deletes it, so an
interrupted or repeated replay never loses an entry (a failing XADD stops the script
before the XDEL) and never moves one twice. Replaying an event already in the ledger is
harmless: the ledger's unique event id turns it into a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError
from redis import Redis

from billing.events import UsageEvent
from billing.settings import BillingSettings

#: A whole stream entry id; a bare millisecond part would match several entries.
ENTRY_ID = re.compile(r"^\d+-\d+$")

#: KEYS: dead-letter stream, usage stream. ARGV: the entry id. Returns 1 if moved, 0 if
#: the entry is gone (already replayed). ``source_id`` and ``reason`` are what the consumer
#: added when dead-lettering; the other fields are the original entry.
MOVE_BACK = """
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then return 0 end
local fields, original = found[1][2], {}
for i = 1, #fields, 2 do
  if fields[i] ~= 'source_id' and fields[i] ~= 'reason' then
    table.insert(original, fields[i])
    table.insert(original, fields[i + 1])
  end
end
redis.call('XADD', KEYS[2], '*', unpack(original))
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
"""


class ReplayInterrupted(Exception):
    """Redis failed part way; ``replayed`` entries had already moved."""

    def __init__(self, replayed: list[str], cause: Exception) -> None:
        super().__init__(str(cause))
        self.replayed = replayed
        self.cause = cause


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str
    source_id: str
    reason: str
    #: The usage event's request id, when the entry still parses as one.
    request_id: str | None


def _decode(value: bytes | None) -> str:
    return value.decode(errors="replace") if value is not None else ""


def _dead_letter(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    try:
        request_id: str | None = UsageEvent.model_validate_json(fields[b"event"]).event_id
    except (KeyError, ValidationError, ValueError):
        request_id = None
    return DeadLetter(
        entry_id=entry_id.decode(),
        source_id=_decode(fields.get(b"source_id")),
        reason=_decode(fields.get(b"reason")),
        request_id=request_id,
    )


def list_dead_letters(redis: Redis, settings: BillingSettings, limit: int) -> list[DeadLetter]:
    """The oldest ``limit`` dead letters, oldest first."""
    entries = redis.xrange(settings.usage_dead_letter_stream, count=limit)
    return [_dead_letter(entry_id, fields) for entry_id, fields in entries]


def replay_dead_letters(
    redis: Redis, settings: BillingSettings, entry_ids: list[str] | None
) -> list[str]:
    """Move dead letters back onto the usage stream; every one when ``entry_ids`` is None.

    Returns the ids replayed. Malformed or unknown ids raise ``ValueError`` / ``KeyError``
    before anything moves, so a typo never half-applies a list; a Redis failure part way
    raises ``ReplayInterrupted`` carrying what had moved.
    """
    dead_stream = settings.usage_dead_letter_stream
    if entry_ids is None:
        chosen = [entry_id.decode() for entry_id, _ in redis.xrange(dead_stream)]
    else:
        chosen = list(dict.fromkeys(entry_ids))  # the same id twice is one replay
        for entry_id in chosen:
            if not ENTRY_ID.match(entry_id):
                raise ValueError(f"{entry_id!r} is not a dead-letter id (like 1796027344594-0)")
            if not redis.xrange(dead_stream, min=entry_id, max=entry_id):
                raise KeyError(entry_id)
    move_back = redis.register_script(MOVE_BACK)
    replayed: list[str] = []
    for entry_id in chosen:
        try:
            if move_back(keys=[dead_stream, settings.usage_stream], args=[entry_id]):
                replayed.append(entry_id)
        except Exception as exc:
            raise ReplayInterrupted(replayed, exc) from exc
    return replayed
