"""Prefix-aware routing (``gateway.upstream.routing``) and the pool's policies: which replica a
request goes to, from its parsed body as the gateway sees it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.api.protocol import ChatCompletionRequest, CompletionRequest
from gateway.api.shaping import prefix_key
from gateway.metrics import GatewayMetrics
from gateway.upstream.engine_slots import EngineSlots
from gateway.upstream.pools import Replica, UpstreamPool
from gateway.upstream.routing import LOAD_SLACK, PrefixTable
from gateway.upstream.slot_policy import SlotPolicy

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}


def chat(*messages: dict[str, Any], **fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "composer-2.5", "messages": list(messages), **fields}
    )


def conversation(name: str, turns: int) -> list[dict[str, str]]:
    task = f"task {name}: make the failing test pass; the traceback follows. " * 30
    messages = [SYSTEM, {"role": "user", "content": task}]
    for turn in range(turns):
        messages += [
            {"role": "assistant", "content": f"{name} step {turn}"},
            {"role": "user", "content": f"{name} result {turn}"},
        ]
    return messages


def pool(replicas: int, routing: Any = "prefix", slots: int | None = None) -> UpstreamPool:
    return UpstreamPool(
        "standard",
        [
            Replica(
                f"http://replica-{i}",
                slots=None if slots is None else EngineSlots(SlotPolicy(slots, shared=False)),
            )
            for i in range(replicas)
        ],
        GatewayMetrics(),
        routing=routing,
    )


def route(upstreams: UpstreamPool, request: Any, turn: int, session: str | None = None) -> Replica:
    """What ``UpstreamPool.open`` does before it sends: pick, then remember the choice."""
    key = prefix_key(request, session)
    replica = upstreams.pick(set(), turn, key)
    assert replica is not None
    assert upstreams.prefixes is not None
    upstreams.prefixes.record(key, replica)
    return replica


def test_each_turn_of_a_conversation_goes_where_its_prefix_is() -> None:
    upstreams = pool(3)
    homes: dict[str, Replica] = {}
    requests = iter(range(1000))  # the pool's rotation: one turn per request
    for turn in range(6):
        for name in ("a", "b", "c", "d", "e", "f"):
            replica = route(upstreams, chat(*conversation(name, turn)), next(requests))
            assert homes.setdefault(name, replica) is replica, (name, turn)
    # New conversations share only the system prompt: they spread by load, not all to
    # the replica that first saw the system prompt.
    assert len(set(homes.values())) == 3


def test_a_prompt_mostly_held_by_a_replica_goes_there() -> None:
    upstreams = pool(2)
    long_system = {"role": "system", "content": "shared instructions " * 500}
    first = route(upstreams, chat(long_system, {"role": "user", "content": "a"}), 0)
    for turn in range(1, 4):  # most of each prompt is the system prompt first cached
        prompt = chat(long_system, {"role": "user", "content": f"question {turn}"})
        assert route(upstreams, prompt, turn) is first


def test_a_busy_replica_loses_its_prefix_to_the_least_loaded() -> None:
    upstreams = pool(2)
    home = route(upstreams, chat(*conversation("a", 0)), 0)
    other = next(r for r in upstreams.replicas if r is not home)
    home.outstanding = LOAD_SLACK  # within the slack: still home
    assert route(upstreams, chat(*conversation("a", 1)), 1) is home
    home.outstanding = LOAD_SLACK + 1
    assert route(upstreams, chat(*conversation("a", 2)), 2) is other
    home.outstanding = 0  # the conversation's next turn follows its latest prefix
    assert route(upstreams, chat(*conversation("a", 3)), 3) is other


def test_a_full_engine_never_wins_by_prefix() -> None:
    upstreams = pool(2, slots=1)
    home = route(upstreams, chat(*conversation("a", 0)), 0)
    assert home.slots is not None
    home.slots.try_take("standard")  # its only slot is in use
    assert route(upstreams, chat(*conversation("a", 1)), 1) is not home


def test_a_session_sticks_and_a_replica_that_went_down_is_forgotten() -> None:
    upstreams = pool(2)
    first = route(upstreams, chat({"role": "user", "content": "one"}), 0, session="s-1")
    for turn in range(1, 5):  # unrelated prompts, same session: same replica
        prompt = chat({"role": "user", "content": f"other {turn}"})
        assert route(upstreams, prompt, turn, session="s-1") is first
    named = chat({"role": "user", "content": "five"}, user="s-1")  # the `user` field too
    assert route(upstreams, named, 5) is first
    upstreams.forget(first)
    assert upstreams.prefixes is not None and len(upstreams.prefixes) == sum(
        r is not first for r in upstreams.prefixes._prefixes.values()
    )


def test_tools_are_part_of_the_prefix() -> None:
    tool = {"type": "function", "function": {"name": "run_tests", "parameters": {}}}
    plain, tooled = prefix_key(chat(SYSTEM), None), prefix_key(chat(SYSTEM, tools=[tool]), None)
    assert plain.hashes[0] != tooled.hashes[0]


@pytest.mark.parametrize(
    "prompt",
    ["lorem ipsum " * 400, list(range(1000)), ["lorem ipsum " * 400, "second prompt"]],
)
def test_text_prompts_share_their_leading_blocks(prompt: Any) -> None:
    first = prompt[0] if isinstance(prompt, list) and isinstance(prompt[0], str) else prompt
    longer = first + (" more" if isinstance(first, str) else [7, 8, 9])
    key = prefix_key(CompletionRequest(model="composer-2.5", prompt=prompt), None)
    extended = prefix_key(CompletionRequest(model="composer-2.5", prompt=longer), None)
    assert len(key.hashes) > 2
    assert extended.hashes[: len(key.hashes) - 1] == key.hashes[:-1]


@pytest.mark.parametrize("routing", ["round_robin", "least_outstanding"])
def test_the_other_policies_ignore_prefixes(routing: Any) -> None:
    upstreams = pool(2, routing)
    assert upstreams.prefixes is None
    request = chat(*conversation("a", 0))
    picked = [upstreams.pick(set(), turn, prefix_key(request, None)) for turn in range(4)]
    assert picked == [upstreams.replicas[0], upstreams.replicas[1]] * 2  # idle: in turn


def test_the_table_is_bounded() -> None:
    table: PrefixTable[str] = PrefixTable(entries=100, sessions=10)
    for i in range(50):
        key = prefix_key(chat(*conversation(str(i), 3)), f"session-{i}")
        table.record(key, "replica")
    assert len(table) == 100
    assert len(table._sessions) == 10
    # A session is kept as a digest: a 30 KB x-session-id costs the table 16 bytes.
    table.record(prefix_key(chat(SYSTEM), "s" * 30_000), "replica")
    assert all(len(session) == 16 for session in table._sessions)
