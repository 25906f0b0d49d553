"""Admission while Redis does not answer: when it counts as unreachable, the 503 refusal,
and what one gateway process may admit meanwhile (a small allowance per outage).

Without Redis there is no shared budget to check, so each process may admit requests up to
its own allowance: at most ``requests`` requests, and at most ``nano_usd`` of worst-case
cost for the requests in flight plus actual cost for those finished (a finished request
gives back what it did not use). An outage starts at the first admission that finds Redis
unreachable and ends when Redis answers again (on a Redis Cluster: when every shard found
unreachable, or in the middle of a move, has answered again); the next outage starts
with a full allowance. So while Redis is down an org can go over its budget by at most one request's
worst case plus (gateway processes x allowance), and the usage of every request admitted
meanwhile reaches the ledger through the disk spool.
"""

from __future__ import annotations

import logging

from redis import exceptions as redis_errors

from billing.meter.protocol import AdmissionRefused

logger = logging.getLogger(__name__)


def unreachable(exc: BaseException) -> bool:
    """Redis refused, dropped or never completed the connection, as opposed to being slow
    or saturated.

    Only then may the local allowance admit: after a read timeout the script may have
    run. A connect timeout sent nothing.
    """
    if isinstance(exc, redis_errors.TimeoutError):
        return str(exc).startswith("Timeout connecting")
    return True  # refused or dropped, or (a cluster) a slot being moved: the script did not run


#: A cluster moving the slot of a call's keys (a resharding, a failover under way): the
#: script did not run. Admission treats it as an outage of that shard, with its
#: allowance, for as long as it lasts; a settlement is spooled.
SLOT_MOVING = (redis_errors.TryAgainError, redis_errors.ClusterDownError)


def billing_unavailable() -> AdmissionRefused:
    return AdmissionRefused(
        "billing is temporarily unavailable; retry shortly",
        code="billing_unavailable",
        retry_after_s=1,
        headers={"retry-after": "1"},
        status_code=503,
    )


class LocalAllowance:
    def __init__(self, nano_usd: int, requests: int) -> None:
        self.nano_usd = nano_usd
        self.requests = requests
        self.down = False
        #: Numbers the outages: what a request admitted in an earlier one gives back no
        #: longer counts.
        self.outage = 0
        self.spent_nano = 0
        self.admitted = 0
        self._refusing = False
        self._held: dict[str, tuple[int, int]] = {}

    def take(self, request_id: str, worst_nano: int) -> bool:
        """Admit a request of this worst-case cost if the allowance has room for it."""
        if not self.down:
            self.down = True
            self.outage += 1
            self.spent_nano = self.admitted = 0
            self._refusing = False
            logger.warning(
                "Redis unreachable: admitting up to %d requests / %d nano-USD on this "
                "process's allowance until it answers again",
                self.requests,
                self.nano_usd,
            )
        if self.admitted >= self.requests or self.spent_nano + worst_nano > self.nano_usd:
            if not self._refusing:  # once per outage: every refusal would flood the log
                self._refusing = True
                logger.warning("the Redis-outage allowance is used up: refusing with 503")
            return False
        self.admitted += 1
        self.spent_nano += worst_nano
        self._held[request_id] = (self.outage, worst_nano)
        return True

    def settle(self, request_id: str, actual_nano: int) -> None:
        """A request admitted on the allowance ended: give back what it did not use."""
        if not self._held:
            return
        entry = self._held.pop(request_id, None)
        if entry is not None and self.down and entry[0] == self.outage:
            self.spent_nano -= max(0, entry[1] - actual_nano)

    def redis_answered(self) -> None:
        """Redis is back: the outage is over (the next one gets a full allowance)."""
        if self.down:
            self.down = False
            logger.warning(
                "Redis answers again; %d requests were admitted on the local allowance",
                self.admitted,
            )
