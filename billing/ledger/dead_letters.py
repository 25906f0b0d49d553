"""The usage stream's dead letters: list them, and send them back through the ledger.

An entry is dead-lettered when the consumer could not write it (unparseable, rejected by
the database, or delivered too many times, e.g. while the ledger kept crashing). Once
the cause is fixed an operator replays it: the entry's original fields are appended to
the usage stream of its org's shard, and only then is it deleted, so an interrupted replay
never loses an entry (a failing XADD comes before the XDEL). Not one script: on a Redis
Cluster the two streams are in different slots. An interruption between the two, or two
operators replaying at once, can append an entry twice, which is harmless: the ledger's
unique event id turns the second into a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError
from redis import Redis

from billing.meter.events import UsageEvent
from billing.meter.keyspace import Keyspace
from billing.settings import BillingSettings

#: A whole stream entry id; a bare millisecond part would match several entries.
ENTRY_ID = re.compile(r"^\d+-\d+$")

#: Fields the consumer added when dead-lettering; the others are the original entry's.
ADDED_FIELDS = (b"source_id", b"reason")


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
    keys = Keyspace(settings.billing_shards, settings.usage_stream)
    replayed: list[str] = []
    for entry_id in chosen:
        try:
            found = redis.xrange(dead_stream, min=entry_id, max=entry_id)
            if not found:
                continue  # replayed meanwhile
            fields = {k: v for k, v in found[0][1].items() if k not in ADDED_FIELDS}
            redis.xadd(_stream_for(fields, keys), fields)  # type: ignore[arg-type]
            redis.xdel(dead_stream, entry_id)
            replayed.append(entry_id)
        except Exception as exc:
            raise ReplayInterrupted(replayed, exc) from exc
    return replayed


def _stream_for(fields: dict[bytes, bytes], keys: Keyspace) -> str:
    """The usage stream of the event's org's shard; an entry that is no usage event goes
    to shard 0's (where the consumer dead-letters it again, with the reason)."""
    try:
        org_id = UsageEvent.model_validate_json(fields[b"event"]).org_id
    except (KeyError, ValidationError, ValueError):
        return keys.shard_stream(0)
    return keys.usage_stream_of(org_id)
