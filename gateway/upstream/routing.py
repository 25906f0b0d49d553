"""Which replica of a pool gets a request: prefix-cache aware, balanced against load.

vLLM keeps the KV cache of prompts it has seen and reuses it for a later prompt that
starts the same way (an agent's next turn, a shared system prompt): the prefill of that
part is skipped, which is most of the time to first token of a long conversation. That
only helps if the request reaches the replica that holds the prefix, so the gateway
remembers which replica it last sent each prompt prefix to and sends a request there,
unless that replica is busier than the pool by more than ``LOAD_SLACK`` requests, or
holds less than ``MATCH_SHARE`` of the prompt (a new conversation that shares only a
system prompt with others): then least outstanding, as without affinity.

Prefixes are tracked without a tokenizer: a chat request's prompt is a chain of hashes,
one per message (each covers the tools and every message up to it), so a conversation's
next turn matches its previous request up to the new messages; a text prompt is hashed
in blocks of ``TEXT_BLOCK_CHARS`` characters or ``TOKEN_BLOCK_IDS`` token ids. A session
named by the ``x-session-id`` header or the ``user`` field sticks to its replica the same
way. The tables are bounded (least recently used entries go first) and per gateway
process: what another process or a restarted gateway sent elsewhere is simply a miss.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

R = TypeVar("R")

#: ``prefix``: prefix-cache aware (the default); ``least_outstanding``: the replica with
#: the fewest requests in flight; ``round_robin``: each replica in turn.
RoutingPolicy = Literal["prefix", "least_outstanding", "round_robin"]
ROUTING_POLICIES: tuple[RoutingPolicy, ...] = ("prefix", "least_outstanding", "round_robin")
#: A replica holding the prefix keeps getting it while it has at most this many requests
#: in flight more than the least busy replica: the cache saves a prefill, a queue costs
#: whole requests.
LOAD_SLACK = 4
#: The share of a prompt (in bytes) a replica must hold for the request to go there: a
#: shorter match saves little prefill and would pile new conversations onto one replica.
MATCH_SHARE = 0.5
TEXT_BLOCK_CHARS = 512
TOKEN_BLOCK_IDS = 128
#: Prefix hashes remembered per pool (8 bytes each, plus the table's own overhead).
TABLE_ENTRIES = 200_000
SESSION_ENTRIES = 100_000


@dataclass(frozen=True)
class PrefixKey:
    """A request's prompt as chained hashes (``hashes[i]`` covers blocks 0..i, ``sizes[i]``
    bytes) and a digest of its session, if the client named one (the digest, not the name:
    a client's header must not decide how much memory the table holds)."""

    hashes: tuple[bytes, ...]
    sizes: tuple[int, ...]
    session: bytes | None = None


def _chain(blocks: Iterable[bytes], session: str | None, seed: bytes = b"") -> PrefixKey:
    # One running hash, read out at every block boundary: each block is hashed once.
    running = hashlib.blake2b(seed, digest_size=8)
    hashes, sizes = [], []
    size = len(seed)
    for block in blocks:
        running.update(len(block).to_bytes(4, "little"))  # boundaries are part of it
        running.update(block)
        size += len(block)
        hashes.append(running.copy().digest())
        sizes.append(size)
    named = None if session is None else hashlib.blake2b(session.encode(), digest_size=16).digest()
    return PrefixKey(tuple(hashes), tuple(sizes), named)


def chat_key(
    messages: Sequence[bytes], tools: bytes = b"", session: str | None = None
) -> PrefixKey:
    """``messages``: each message serialised (any stable serialisation); ``tools``: what
    the chat template renders before the messages (the tools serialised, and any other
    setting rendered there)."""
    seed = hashlib.blake2b(tools, digest_size=8).digest() if tools else b""
    return _chain(messages, session, seed)


def text_key(prompt: str | Sequence[int], session: str | None = None) -> PrefixKey:
    if isinstance(prompt, str):
        blocks = (
            prompt[i : i + TEXT_BLOCK_CHARS].encode()
            for i in range(0, len(prompt), TEXT_BLOCK_CHARS)
        )
    else:
        blocks = (
            b",".join(b"%d" % t for t in prompt[i : i + TOKEN_BLOCK_IDS])
            for i in range(0, len(prompt), TOKEN_BLOCK_IDS)
        )
    return _chain(blocks, session)


def recorded_depths(blocks: int) -> list[int]:
    """The prefix depths a request is remembered (and looked up) by: the whole prompt,
    which the conversation's next turn extends, and every power-of-two number of blocks,
    where another request may branch off. O(log n) entries per request, not n: a table
    of every block would cost each long conversation's request as many writes, and the
    garbage collector a table many times larger."""
    depths = []
    width = 1
    while width < blocks:
        depths.append(width - 1)
        width *= 2
    if blocks:
        depths.append(blocks - 1)
    return depths


K = TypeVar("K")


class _Lru(OrderedDict[K, R]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: K, value: R) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class PrefixTable(Generic[R]):
    """Where each prefix (and session) of one pool was last sent."""

    def __init__(self, entries: int = TABLE_ENTRIES, sessions: int = SESSION_ENTRIES) -> None:
        self._prefixes: _Lru[bytes, R] = _Lru(entries)
        self._sessions: _Lru[bytes, R] = _Lru(sessions)

    def __len__(self) -> int:
        return len(self._prefixes)

    def pick(
        self,
        key: PrefixKey,
        candidates: Sequence[R],
        load: Callable[[R], int],
        fallback: Callable[[Sequence[R]], R],
    ) -> R:
        """The candidate that holds the session, or the longest prefix of ``key`` if that is
        at least ``MATCH_SHARE`` of it, unless it is ``LOAD_SLACK`` busier than the least
        busy; else ``fallback(candidates)``."""
        least = min(load(c) for c in candidates)

        def usable(replica: R) -> bool:
            return replica in candidates and load(replica) <= least + LOAD_SLACK

        if key.session is not None:
            held = self._sessions.get(key.session)
            if held is not None and usable(held):
                return held
        enough = MATCH_SHARE * key.sizes[-1] if key.sizes else 0
        for depth in reversed(recorded_depths(len(key.hashes))):
            if key.sizes[depth] < enough:
                break  # shorter matches are worth even less
            found = self._prefixes.get(key.hashes[depth])
            if found is not None:
                if usable(found):
                    return found
                break  # the longest match is busy: a shorter one is worth less
        return fallback(candidates)

    def record(self, key: PrefixKey, replica: R) -> None:
        """``replica`` was sent ``key``: it holds these prefixes now."""
        for depth in recorded_depths(len(key.hashes)):
            self._prefixes.put(key.hashes[depth], replica)
        if key.session is not None:
            self._sessions.put(key.session, replica)

    def forget(self, replica: R) -> None:
        """``replica`` lost its cache (it went down)."""
        for stale in [k for k, v in self._prefixes.items() if v is replica]:
            del self._prefixes[stale]
        for session in [k for k, v in self._sessions.items() if v is replica]:
            del self._sessions[session]
