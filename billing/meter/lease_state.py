"""What a process holds for busy keys' leases (``billing.meter.leases``): per lease, per
key (with its customer) and, over their leases, per key and per org."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from billing.meter.ratelimit_headers import ratelimit_headers


def headroom(
    left_requests: int, left_tokens: int, left_budget: int, tokens: int, worst: int
) -> int:
    """About how many more requests of ``tokens`` and ``worst`` nano-USD fit in what is
    left (``Admission.headroom``)."""
    by_budget = left_budget // worst if worst > 0 else left_requests
    return min(left_requests, left_tokens // max(1, tokens), by_budget)


#: org, key, plan, customer: whose requests a lease admits.
HolderKey = tuple[str, str, str, str | None]


class Waiting:
    """What a key's leases (or an org's) hold unused or have asked for, in this process,
    and what it had left as last seen."""

    def __init__(self) -> None:
        self.count = self.tokens = self.units = 0
        self.left_requests = self.left_tokens = self.left_budget = 0
        #: Holders counted here: it is forgotten with the last of them.
        self.holders = 0

    def add(self, count: int, tokens: int, units: int) -> None:
        self.count += count
        self.tokens += tokens
        self.units += units


class Lease:
    """One process's slice of a key's rate limits and its org's budget, in one period."""

    def __init__(self, member: str, period: str) -> None:
        #: The lease's reservation: its id in the budget of ``period``.
        self.member, self.period = member, period
        self.reservation_id = f"{period}/{member}"
        #: What is left unused.
        self.requests = self.tokens = self.units = 0
        #: ``time.monotonic()`` after which no request is admitted on it.
        self.expires = 0.0
        #: Grants applied to it (the next one is numbered ``grants + 1``).
        self.grants = 0
        #: Requests admitted on it and not yet settled (their parts stay reserved).
        self.in_flight = 0
        #: The Redis key of its reservation's expiry, and how long it is renewed at most
        #: (``time.monotonic()``; pushed on by the requests taken on it).
        self.resv_key = ""
        self.held_until = 0.0
        self.retired = False
        #: The last grant's reply: what Redis said was left besides the lease, and the
        #: headers it makes (``granted``).
        self.rpm = self.tpm = 0
        self.left_requests = self.left_tokens = self.left_budget = 0
        self.template: dict[str, str] = {}

    def granted(self, reply: Sequence[Any]) -> None:
        """What the grant's reply (``LEASE``'s) says was left, and its headers' template."""
        self.left_requests, self.left_tokens = int(reply[1]), int(reply[3])
        self.left_budget = int(reply[6])
        self.template = ratelimit_headers(
            rpm=self.rpm,
            tpm=self.tpm,
            remaining_requests=0,
            reset_requests_us=int(reply[2]),
            remaining_tokens=0,
            reset_tokens_us=int(reply[4]),
        )

    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` of a request admitted on the lease: what Redis said was left
        at the last grant plus what is left of the lease; the resets as of that grant."""
        return {
            **self.template,
            "x-ratelimit-remaining-requests": str(self.left_requests + self.requests),
            "x-ratelimit-remaining-tokens": str(self.left_tokens + self.tokens),
        }


class Holder:
    def __init__(self, holder_id: HolderKey, now: float, key: Waiting, org: Waiting) -> None:
        self.id = holder_id
        self.window_start = now
        #: Requests in the current lifetime-long window, and in the last one.
        self.arrivals = self.last_rate = 0
        #: Running means of a request's tokens and units (integers: they size grants).
        self.mean_tokens = self.mean_units = 0
        self.lease: Lease | None = None
        #: A grant is on its way (the lease is not given back meanwhile).
        self.asking = False
        #: Requests of the last grant.
        self.size = 0
        self.key, self.org = key, org
        self.timer: asyncio.TimerHandle | None = None
