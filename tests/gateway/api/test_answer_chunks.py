"""vLLM's chunks read into structs (gateway/api/answer_chunks.py) assemble the same answer
as reading each chunk as plain dicts, field by field, did: for chunks in vLLM's shape,
with any value in any field, and for chunks of other nestings (read leniently)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.answers import Assembler, ChatAssembler, CompletionAssembler
from gateway.api.stream import UsageTally


def chunk_reference(assembler: Assembler, data: dict[str, Any]) -> None:
    """One parsed chunk into ``assembler``, read as dicts (the reading structs replaced).
    Choices that are no objects count for nothing."""
    if "error" in data:
        error = data["error"]
        assembler.error = error if isinstance(error, dict) else {"message": str(error)}
        return
    if not assembler.head:
        assembler.head.update(id=data.get("id"), created=data.get("created"),
                              model=data.get("model"))  # fmt: skip
    for key in ("system_fingerprint", "metrics"):
        if data.get(key) is not None:
            assembler.head[key] = data[key]
    choices = data.get("choices")
    choices = [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else choices
    usage = data.get("usage")
    if usage and isinstance(usage, dict):
        UsageTally.observe(assembler.tally, usage, choices)
    for choice in choices if isinstance(choices, list) else ():
        index = choice.get("index", 0)
        index = index if isinstance(index, int) else 0
        state = assembler.choices.get(index) or assembler.new_choice(index)
        assembler.choices[index] = state
        add_reference(assembler, state, choice, data)
        if choice.get("finish_reason") is not None:
            state["finish_reason"] = choice["finish_reason"]
            state["stop_reason"] = choice.get("stop_reason")


def listed(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def add_reference(assembler: Assembler, state: dict[str, Any], choice: dict[str, Any],
                  data: dict[str, Any]) -> None:  # fmt: skip
    def append(key: str, text: object) -> None:
        if isinstance(text, str):
            state[key] = [*(state[key] or []), text]

    if isinstance(choice.get("token_ids"), list):
        state["token_ids"] = [*(state["token_ids"] or []), *choice["token_ids"]]
    logprobs = choice.get("logprobs")
    if isinstance(assembler, CompletionAssembler):
        append("text", choice.get("text"))
        if isinstance(logprobs, dict):
            kept = state["logprobs"] or {k: [] for k in ("text_offset", "token_logprobs",
                                                         "tokens", "top_logprobs")}  # fmt: skip
            for key in kept:
                kept[key] = [*kept[key], *listed(logprobs.get(key))]
            state["logprobs"] = kept
        if state["prompt_token_ids"] is None and choice.get("prompt_token_ids") is not None:
            state["prompt_token_ids"] = choice["prompt_token_ids"]
        return
    assert isinstance(assembler, ChatAssembler)
    if assembler.prompt_token_ids is None and data.get("prompt_token_ids") is not None:
        assembler.prompt_token_ids = data["prompt_token_ids"]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("role"):
            state["role"] = delta["role"]
        append("content", delta.get("content"))
        append("reasoning", delta.get("reasoning"))
        if isinstance(delta.get("tool_calls"), list):
            for call in delta["tool_calls"]:
                if isinstance(call, dict):
                    index = call.get("index", 0)
                    index = index if isinstance(index, int) else 0
                    kept = state["tool_calls"].setdefault(index, {
                        "id": None, "type": "function",
                        "function": {"name": "", "arguments": ""}})  # fmt: skip
                    for key in ("id", "type"):
                        if call.get(key):
                            kept[key] = call[key]
                    function = call.get("function")
                    function = function if isinstance(function, dict) else {}
                    for key in ("name", "arguments"):
                        if isinstance(function.get(key), str):
                            kept["function"][key] += function[key]
    if isinstance(logprobs, dict):
        state["logprobs"] = state["logprobs"] or {"content": [], "refusal": None}
        state["logprobs"]["content"] = [*state["logprobs"]["content"],
                                        *listed(logprobs.get("content"))]  # fmt: skip


#: Any JSON value (of a type a field may not expect).
ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3),
                st.lists(st.integers(0, 9), max_size=2), st.just({}))  # fmt: skip


def mostly(
    expected: st.SearchStrategy[Any], other: st.SearchStrategy[Any] = ANY, one_in: int = 4
) -> st.SearchStrategy[Any]:
    """``expected``, and one time in ``one_in`` ``other`` (any value)."""
    drawn = st.tuples(st.integers(1, one_in), expected, other)
    return drawn.map(lambda each: each[2] if each[0] == 1 else each[1])


TEXT = mostly(st.text(max_size=4))
INDEX = mostly(st.integers(0, 2))
CALL = mostly(st.fixed_dictionaries({"index": INDEX}, optional={
    "id": TEXT, "type": TEXT,
    "function": mostly(st.fixed_dictionaries({}, optional={"name": TEXT,
                                                            "arguments": TEXT}))}))  # fmt: skip
DELTA = mostly(st.fixed_dictionaries({}, optional={
    "role": TEXT, "content": TEXT, "reasoning": TEXT,
    "tool_calls": mostly(st.lists(CALL, max_size=2))}))  # fmt: skip
LOGPROBS = st.one_of(st.none(), ANY, st.fixed_dictionaries({}, optional={
    "content": mostly(st.lists(st.integers(), max_size=2)),
    "tokens": st.lists(st.text(max_size=2), max_size=2),
    "token_logprobs": st.lists(st.integers(), max_size=2)}))  # fmt: skip
CHOICE = mostly(st.fixed_dictionaries({"index": INDEX}, optional={
    "delta": DELTA, "text": TEXT, "logprobs": LOGPROBS, "finish_reason": TEXT,
    "stop_reason": ANY, "token_ids": mostly(st.lists(st.integers(0, 99), max_size=3)),
    "prompt_token_ids": ANY}))  # fmt: skip
USAGE = mostly(st.fixed_dictionaries({}, optional={
    "prompt_tokens": mostly(st.integers(0, 50)), "completion_tokens": mostly(st.integers(0, 50)),
    "total_tokens": st.integers(0, 99)}))  # fmt: skip
CHUNK = st.fixed_dictionaries({"choices": mostly(st.lists(CHOICE, max_size=3))}, optional={
    "id": TEXT, "created": ANY, "model": TEXT, "system_fingerprint": ANY, "metrics": ANY,
    "usage": USAGE, "prompt_token_ids": ANY})  # fmt: skip
ERROR = st.fixed_dictionaries({"error": st.one_of(ANY, st.just({"message": "x"}))})
EVENTS = st.lists(mostly(mostly(CHUNK, ERROR, 8)), max_size=8)


def assembled(assembler: Assembler, events: list[Any]) -> dict[str, Any]:
    for event in events:
        assembler.feed(b"data: " + json.dumps(event).encode() + b"\n\n")
    assembler.feed(b"data: [DONE]\n\n")
    return assembler.answer()


def assembled_reference(assembler: Assembler, events: list[Any]) -> dict[str, Any]:
    for event in events:
        if isinstance(event, dict):
            chunk_reference(assembler, event)
    return assembler.answer()


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_a_chat_answer_is_the_one_read_field_by_field(events: list[Any]) -> None:
    assert assembled(ChatAssembler("auto"), events) == assembled_reference(
        ChatAssembler("auto"), events
    )


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.sampled_from([None, 1, 2]))
def test_a_completion_answer_is_the_one_read_field_by_field(
    events: list[Any], per_prompt: int | None
) -> None:
    assert assembled(CompletionAssembler(per_prompt), events) == assembled_reference(
        CompletionAssembler(per_prompt), events
    )


def test_json_msgspec_refuses_is_read_too() -> None:
    chat = ChatAssembler(None)
    chat.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"},"logprobs":'
              b'{"content":[{"logprob":NaN}]}}],"usage":{"prompt_tokens":1,'
              b'"completion_tokens":123456789012345678901234567890}}\n\n')  # fmt: skip
    answer = chat.answer()
    assert answer["choices"][0]["message"]["content"] == "a"
    assert answer["usage"]["completion_tokens"] == 123456789012345678901234567890
