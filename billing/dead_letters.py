"""The usage stream's dead letters: list them, and send them back through the ledger.

An entry is dead-lettered when the consumer could not write it (unparseable, rejected by
the database, or delivered too many times, e.g. while the ledger kept crashing). Once
the cause is fixed an operator replays it: the original fields go back onto the usage
stream and leave the dead-letter stream in one MULTI, so a replay interrupted at any
point neither loses the entry nor leaves it in both places. Replaying an event already
in the ledger is harmless: the ledger's unique event id turns it into a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from redis import Redis

from billing.events import UsageEvent
from billing.settings import BillingSettings

#: Fields the consumer adds when dead-lettering; everything else is the original entry.
BOOKKEEPING_FIELDS = (b"source_id", b"reason")


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str
    source_id: str
    reason: str
    #: The usage event's request id, when the entry still parses as one.
    request_id: str | None
    fields: dict[bytes, bytes]

    @property
    def original_fields(self) -> dict[bytes, bytes]:
        return {k: v for k, v in self.fields.items() if k not in BOOKKEEPING_FIELDS}


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
        fields=fields,
    )


def list_dead_letters(redis: Redis, settings: BillingSettings, limit: int) -> list[DeadLetter]:
    """The oldest ``limit`` dead letters, oldest first."""
    entries = redis.xrange(settings.usage_dead_letter_stream, count=limit)
    return [_dead_letter(entry_id, fields) for entry_id, fields in entries]


def replay_dead_letters(
    redis: Redis, settings: BillingSettings, entry_ids: list[str] | None
) -> list[str]:
    """Move dead letters back onto the usage stream; every one when ``entry_ids`` is None.

    Returns the ids replayed. Unknown ids raise ``KeyError`` before anything moves, so a
    typo never half-applies a list.
    """
    dead_stream = settings.usage_dead_letter_stream
    if entry_ids is None:
        chosen = [(eid, fields) for eid, fields in redis.xrange(dead_stream)]
    else:
        chosen = []
        for entry_id in entry_ids:
            found = redis.xrange(dead_stream, min=entry_id, max=entry_id)
            if not found:
                raise KeyError(entry_id)
            chosen.append(found[0])
    replayed = []
    for entry_id, fields in chosen:
        letter = _dead_letter(entry_id, fields)
        pipe = redis.pipeline(transaction=True)
        pipe.xadd(settings.usage_stream, letter.original_fields)  # type: ignore[arg-type]
        pipe.xdel(dead_stream, entry_id)
        pipe.execute()
        replayed.append(letter.entry_id)
    return replayed
