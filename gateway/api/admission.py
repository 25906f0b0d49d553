"""Billing's admission as the gateway uses it: when a request may go upstream while its
admission is still on its way, and what a refusal answers.

Admission is a Redis round trip. Waited for before the request goes upstream, it adds
that round trip (and, on a quiet gateway, the wake-up of a Redis on another core) to
every request's latency. Most requests come from keys far from every limit, and those
are *overlapped*: the request is written to its engine first, and the admission's answer
is awaited while the engine works on it, before a byte of the answer is relayed
(``gateway.api.relay``). A refusal then closes the upstream connection, which aborts the
request in vLLM: the client gets the refusal, exactly as if it had been waited for, and
nothing it did not pay for.

A refused request must not cost the engines much, or limits would stop protecting them,
so a key's request is overlapped only while the key's last admission in this process
was granted with ``OVERLAP_HEADROOM`` or more requests like it left under its rate
limits and its org's budget (``Admission.headroom``). A refusal, or a key near a limit,
sends the key's requests back to waiting for admission until it is clear again: what a
key at its limit sends never reaches an engine, and the overlapped requests refused are
at most those a key sends within one round trip of crossing a limit it could not see
coming (its org suspended, a budget spent by its other keys), and no more than the bound
below.

A clear key has at most ``headroom // OVERLAP_HEADROOM`` requests (and never more than
``MAX_OVERLAPPED_PER_KEY``) on their way upstream ahead of their admissions in one
process: a burst of a key's requests goes ahead up to that many, and the rest wait for
their admissions. So the overlapped requests that can still be refused stay well inside
what the key's last admission said would fit, however many the key sends at once.

Any number of keys overlap at once: a gateway that made requests wait whenever another
admission was on its way left its core idle while a batch of admissions was in Redis (9%
of the time, with a core of its own and 8 clients), which cost more throughput than the
task an overlap takes (measured in ``bench/RESULTS.md``).
"""

from __future__ import annotations

from billing.contract import Admission, AdmissionRefused
from gateway.errors import GatewayError

#: Requests like the last one that must still fit for a key's next one to be overlapped:
#: the margin for its other requests in flight and for a next request larger than the last.
OVERLAP_HEADROOM = 8
#: Overlapped admissions of one key on their way at once, at most, in one process.
MAX_OVERLAPPED_PER_KEY = 32
#: Keys remembered per process; past it the memory starts over (every key then waits for
#: its next admission once, which only costs that request the round trip).
MAX_KEYS = 100_000


class AdmissionStanding:
    """Which keys' next requests may be overlapped with their admission, and how many of
    each key's overlapped admissions are on their way."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        #: Per clear key: how many of its admissions may be on their way overlapped.
        self._allowed: dict[str, int] = {}
        #: Per key with overlapped admissions on their way: how many.
        self._overlapping: dict[str, int] = {}
        self._max_keys = max_keys

    def overlaps(self, key_id: str) -> bool:
        """Whether the key's next request may go upstream before its admission."""
        return self._overlapping.get(key_id, 0) < self._allowed.get(key_id, 0)

    def started(self, key_id: str) -> None:
        """An overlapped admission of the key is on its way (``ended`` once it is back)."""
        self._overlapping[key_id] = self._overlapping.get(key_id, 0) + 1

    def ended(self, key_id: str) -> None:
        left = self._overlapping.pop(key_id, 1) - 1
        if left > 0:
            self._overlapping[key_id] = left

    def granted(self, key_id: str, admission: Admission) -> None:
        headroom = admission.headroom
        if headroom is not None and headroom >= OVERLAP_HEADROOM:
            if len(self._allowed) >= self._max_keys and key_id not in self._allowed:
                self._allowed.clear()
            self._allowed[key_id] = min(MAX_OVERLAPPED_PER_KEY, headroom // OVERLAP_HEADROOM)
        else:
            self._allowed.pop(key_id, None)

    def refused(self, key_id: str) -> None:
        self._allowed.pop(key_id, None)


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
