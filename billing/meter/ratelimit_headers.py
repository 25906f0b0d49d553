"""``x-ratelimit-*`` response headers in OpenAI's format."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_reset(microseconds: int) -> str:
    """OpenAI writes resets like ``20ms``, ``1s``, ``6m0s``."""
    ms = max(0, (microseconds + 999) // 1000)
    if ms < 1000:
        return f"{ms}ms"
    seconds = (ms + 999) // 1000
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds}s" if minutes else f"{seconds}s"


def ratelimit_headers(
    *,
    rpm: int,
    tpm: int,
    remaining_requests: int,
    reset_requests_us: int,
    remaining_tokens: int,
    reset_tokens_us: int,
) -> dict[str, str]:
    return {
        "x-ratelimit-limit-requests": str(rpm),
        "x-ratelimit-limit-tokens": str(tpm),
        "x-ratelimit-remaining-requests": str(max(0, remaining_requests)),
        "x-ratelimit-remaining-tokens": str(max(0, remaining_tokens)),
        "x-ratelimit-reset-requests": format_reset(reset_requests_us),
        "x-ratelimit-reset-tokens": format_reset(reset_tokens_us),
    }


def admission_headers(reply: Sequence[Any], *, rpm: int, tpm: int) -> dict[str, str]:
    """The headers of an admission script's reply (``billing.meter.scripts.ADMIT``: the requests
    and tokens remaining, and their resets in microseconds, at 1 to 4), granted or not."""
    return ratelimit_headers(
        rpm=rpm,
        tpm=tpm,
        remaining_requests=int(reply[1]),
        reset_requests_us=int(reply[2]),
        remaining_tokens=int(reply[3]),
        reset_tokens_us=int(reply[4]),
    )
