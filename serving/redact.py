"""What gets printed: credentials masked (the one helper every package logs URLs through),
and client-given values shown at a bounded length.

Redis URLs carry their password (``redis://:password@host:6379/0``, or ``?password=`` in
the query, which redis-py reads too), so a URL must never reach a log line, an error
message or a metric label as is. ``serving`` sits below every other package, so this
module is importable from all of them without a cycle.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"

# Query parameters whose value is a credential (redis-py passes unknown ones to the client).
_SECRET_PARAM = re.compile(r"(?i)pass|secret|token|auth|key")


def redact_url(url: str) -> str:
    """``url`` with its credentials masked: ``redis://:***@host:6379/0``.

    The password is masked and the user name kept; a user name alone (the form tokens
    take in some URLs) is masked too, as are credential-like query parameters. A URL
    without credentials comes back unchanged; text that does not parse as a URL comes
    back masked whole rather than risk printing a secret.
    """
    try:
        parts = urlsplit(url)
        _ = parts.port  # a malformed netloc raises here, not while printing
    except ValueError:
        return MASK
    if not parts.scheme or not parts.netloc:
        return MASK if "@" in url else url
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        user, colon, _password = userinfo.partition(":")
        host = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = parts.query
    if any(_SECRET_PARAM.search(name) for name, _value in pairs):
        masked = [(name, MASK if _SECRET_PARAM.search(name) else value) for name, value in pairs]
        query = urlencode(masked, safe="*/")
    return urlunsplit((parts.scheme, host, parts.path, query, parts.fragment))


#: How much of a client-given value an error message repeats.
ECHO_CHARS = 200


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters of the value: a
    client's 1 MB model name must not come back whole (or fill a log line)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    return f"{text[:limit]!r}... ({len(text)} characters)"
