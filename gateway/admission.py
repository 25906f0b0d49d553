"""Billing's admission as the gateway uses it: when a request may go upstream while its
admission is still on its way, and what a refusal answers.

Admission is a Redis round trip. Waited for before the request goes upstream, it adds
that round trip (and, on a quiet gateway, the wake-up of a Redis on another core) to
every request's latency. Most requests come from keys far from every limit, and those
are *overlapped*: the request is written to its engine first, and the admission's answer
is awaited while the engine works on it, before a byte of the answer is relayed
(``gateway.relay``). A refusal then closes the upstream connection, which aborts the
request in vLLM: the client gets the refusal, exactly as if it had been waited for, and
nothing it did not pay for.

A refused request must not cost the engines much, or limits would stop protecting them,
so a key's request is overlapped only while the key's last admission in this process
was granted with ``OVERLAP_HEADROOM`` or more requests like it left under its rate
limits and its org's budget (``Admission.headroom``). A refusal, or a key near a limit,
sends the key's requests back to waiting for admission until it is clear again: what a
key at its limit sends never reaches an engine, and the overlapped requests refused are
at most those a key sends within one round trip of crossing a limit it could not see
coming (its org suspended, a budget spent by its other keys).

A request is overlapped only while no other admission of its gateway process is on its
way. Then the round trip would be the request's alone; otherwise its admission joins the
others' in one write to Redis, and a busy process keeps the CPU an overlap costs (a task
of its own, and fewer events handled per wake-up of the event loop: measured at
saturation in ``bench/RESULTS.md``).
"""

from __future__ import annotations

from billing.meter import Admission, AdmissionRefused
from gateway.errors import GatewayError

#: Requests like the last one that must still fit for a key's next one to be overlapped:
#: the margin for its other requests in flight and for a next request larger than the last.
OVERLAP_HEADROOM = 8
#: Keys remembered per process; past it the memory starts over (every key then waits for
#: its next admission once, which only costs that request the round trip).
MAX_KEYS = 100_000


class AdmissionStanding:
    """Which keys' next requests may be overlapped with their admission."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._clear: set[str] = set()
        self._max_keys = max_keys

    def overlaps(self, key_id: str) -> bool:
        return key_id in self._clear

    def granted(self, key_id: str, admission: Admission) -> None:
        if admission.headroom is not None and admission.headroom >= OVERLAP_HEADROOM:
            if len(self._clear) >= self._max_keys:
                self._clear.clear()
            self._clear.add(key_id)
        else:
            self._clear.discard(key_id)

    def refused(self, key_id: str) -> None:
        self._clear.discard(key_id)


def refusal_error(refused: AdmissionRefused) -> GatewayError:
    """Billing's refusal as the error the client gets (429, or 503 with a retry-after)."""
    headers = dict(refused.headers)
    if refused.retry_after_s is not None:
        headers["retry-after"] = str(refused.retry_after_s)
    error_type = {
        "insufficient_quota": "insufficient_quota",
        "billing_unavailable": "server_error",
    }.get(refused.code, "requests")
    return GatewayError(
        refused.status_code, refused.message, type=error_type, code=refused.code, headers=headers
    )
