"""``POST /v1/responses`` without an engine: the request's translation into the chat
completion it means, its written field policy, and the Responses events and objects built
from vLLM's chat stream, each held to the installed openai SDK's own models (validated
strictly, which the SDK itself does not do)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses import response_create_params as responses_params
from pydantic import TypeAdapter

from gateway.api.protocol import Policy, field_policy, parse_request
from gateway.api.responses.events import ResponseEventWriter
from gateway.api.responses.output import ResponseAssembler
from gateway.api.responses.protocol import ResponsesRequest
from gateway.errors import GatewayError

README = Path(__file__).resolve().parents[4] / "docs" / "api.md"
REQUEST_ID = "req_0123456789abcdef"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def request(**fields: Any) -> ResponsesRequest:
    return parse_request(ResponsesRequest, json.dumps({"model": "composer-2.5", **fields}).encode())


def refusal(**fields: Any) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        request(**fields).to_chat()
    assert refused.value.status_code == 400
    return refused.value


# --- translation ------------------------------------------------------------------------


def test_a_string_input_with_instructions_is_a_system_and_a_user_message() -> None:
    chat = request(input="Say hi.", instructions="Be brief.", max_output_tokens=9).to_chat()
    sent = chat.model_dump(exclude_unset=True, exclude_none=True)
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
    ]
    assert sent["max_completion_tokens"] == 9


def test_a_conversation_with_tool_calls_becomes_chat_messages() -> None:
    chat = request(
        input=[
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather",
             "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "weather",
             "arguments": '{"city": "Lyon"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2",
             "output": [{"type": "input_text", "text": "rain"}]},
        ],
        tools=[{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "weather"},
        reasoning={"effort": "low", "summary": "auto"},
        text={"verbosity": "low", "format": {"type": "json_object"}},
        prompt_cache_key="conversation-7",
    ).to_chat()  # fmt: skip
    sent = chat.model_dump(exclude_unset=True, exclude_none=True)
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["developer", "user", "assistant", "tool", "tool"]
    assistant = sent["messages"][2]
    assert assistant["content"] == "Checking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_1", "call_2"]
    assert sent["messages"][4] == {"role": "tool", "content": "rain", "tool_call_id": "call_2"}
    assert sent["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert sent["response_format"] == {"type": "json_object"}
    assert chat.reasoning_effort == "low" and chat.verbosity == "low"
    assert chat.user == "conversation-7"  # routes the conversation; never sent to vLLM
    assert "user" not in sent


def test_a_json_schema_format_becomes_chats_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = request(
        input="x", text={"format": {"type": "json_schema", "name": "A", "schema": schema}}
    ).to_chat()
    sent = chat.model_dump(exclude_unset=True, exclude_none=True, by_alias=True)
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "A", "schema": schema},
    }


# --- the field policy -------------------------------------------------------------------


def test_every_sdk_parameter_has_a_policy() -> None:
    sdk = {
        name
        for typed_dict in ("ResponseCreateParamsStreaming", "ResponseCreateParamsNonStreaming")
        for name in getattr(responses_params, typed_dict).__annotations__
    }
    policy = field_policy(ResponsesRequest)
    assert sdk - set(policy) == set(), "new SDK parameters: decide their policy"
    assert set(policy) - sdk == set()
    assert policy["store"] is Policy.REFUSED and policy["user"] is Policy.IGNORED


def test_the_readme_lists_every_field_under_its_policy() -> None:
    section = README.read_text().split("## The Responses API", 1)[1].split("\n## ", 1)[0]
    bullets = {
        match[1].lower(): set(re.findall(r"`([a-z_]+)`", match[2]))
        for match in re.finditer(r"^- \*\*(\w+)\*\*(.*?)(?=^\S|^- |\Z)", section, re.M | re.S)
    }
    # Every passed field is translated into the chat request (or echoed: metadata).
    names = {Policy.PASSED: "translated", Policy.IGNORED: "ignored", Policy.REFUSED: "refused"}
    for name, kind in field_policy(ResponsesRequest).items():
        assert name in bullets[names[kind]], f"README: {name} is not listed as {names[kind]}"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"store": True}, "store", "unsupported_parameter"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"max_tokens": 5}, "max_tokens", "unknown_parameter"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "invalid_value"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity", "invalid_value"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type", "invalid_value"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "invalid_value"),
        ({"input": []}, "input", "invalid_value"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_a_400_naming_it(
    fields: dict[str, Any], param: str, code: str
) -> None:
    error = refusal(**{"input": "x", **fields})
    assert (error.param, error.code) == (param, code), error.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
ITEMS = st.sampled_from(
    [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        {"type": "reasoning", "summary": []},
        {"type": "input_file", "file_id": "f"},
    ]
)
FIELD_VALUES = {
    "input": st.text(max_size=8) | st.lists(ITEMS | JSON, max_size=4),
    "text": st.fixed_dictionaries({"format": JSON, "verbosity": JSON}) | JSON,
    "tools": st.lists(st.fixed_dictionaries({"type": JSON, "name": JSON}) | JSON, max_size=2),
    "tool_choice": JSON,
    "reasoning": st.fixed_dictionaries({"effort": JSON}) | JSON,
    **{name: JSON for name in ("max_output_tokens", "temperature", "metadata", "store", "user")},
}


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries({}, optional=FIELD_VALUES))
def test_whatever_a_client_sends_is_a_chat_request_or_a_400(fields: dict[str, Any]) -> None:
    body = json.dumps({"model": "composer-2.5", "input": "x", **fields}).encode()
    try:
        parse_request(ResponsesRequest, body).to_chat()
    except GatewayError as error:
        assert error.status_code == 400 and error.param, error.message


def test_store_false_and_an_input_of_only_reasoning() -> None:
    assert request(input="x", store=False).to_chat().messages[0].content == "x"
    error = refusal(input=[{"type": "reasoning", "summary": []}], instructions="Be brief.")
    assert error.param == "input" and "no message" in error.message


# --- events and objects from vLLM's chat stream ------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **usage: int) -> bytes:
    """One of vLLM's chat chunks with continuous usage; no delta: the final usage chunk."""
    body: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                            "created": 1, "model": "composer-2.5"}  # fmt: skip
    if delta is not None:
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    else:
        body["choices"] = []
    body["usage"] = {"prompt_tokens": 11, **usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def call_delta(index: int, **function: str) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": function}
    if "name" in function:
        call.update(id=f"call_{index}", type="function")
    return {"tool_calls": [call]}


THINK_ANSWER_CALL = [
    chunk({"role": "assistant", "content": ""}, completion_tokens=0),
    chunk({"reasoning": "Let me "}, completion_tokens=1),
    chunk({"reasoning": "think."}, completion_tokens=2),
    chunk({"content": "Calling"}, completion_tokens=3),
    chunk({"content": " it."}, completion_tokens=4),
    chunk(call_delta(0, name="weather", arguments=""), completion_tokens=5),
    chunk(call_delta(0, arguments='{"city": '), completion_tokens=6),
    chunk(call_delta(0, arguments='"Paris"}'), completion_tokens=7),
    chunk(call_delta(1, name="time", arguments="{}"), completion_tokens=8),
    chunk({}, finish="tool_calls", completion_tokens=8),
    chunk(completion_tokens=8, total_tokens=19),
    b"data: [DONE]\n\n",
]


def stream_of(chunks: list[bytes], **request_fields: Any) -> tuple[list[Any], ResponseEventWriter]:
    writer = ResponseEventWriter(
        request(input="x", **request_fields), REQUEST_ID, 1_700_000_000, "composer-2.5", "fast"
    )
    raw = b"".join(chunks)
    sent = b"".join(b"".join(writer.feed(raw[i : i + 37])) for i in range(0, len(raw), 37))
    events = []
    for block in sent.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")), strict=True)
        assert name == f"event: {event.type}"
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events, writer


def test_a_stream_is_openais_events_and_ends_with_the_whole_response() -> None:
    events, writer = stream_of(THINK_ANSWER_CALL)
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    final = events[-1].response
    assert final.status == "completed" and final.service_tier == "priority"
    reasoning, message, weather, clock = final.output
    assert reasoning.content[0].text == "Let me think."
    assert message.content[0].text == "Calling it."
    assert (weather.name, weather.arguments, weather.call_id) == (
        "weather", '{"city": "Paris"}', "call_0"
    )  # fmt: skip
    assert clock.name == "time" and clock.arguments == "{}"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 8)
    assert writer.done and writer.usage["completion_tokens"] == 8  # what billing settles


def test_the_unstreamed_response_is_the_streamed_one() -> None:
    events, _ = stream_of(THINK_ANSWER_CALL)
    assembler = ResponseAssembler(request(input="x"), REQUEST_ID, 1_700_000_000)
    assembler.feed(b"".join(THINK_ANSWER_CALL))
    answer = assembler.answer()
    answer.update(model="composer-2.5", service_tier="priority")  # as the relay sets them
    unstreamed = Response.model_validate(answer, strict=True)
    assert unstreamed == events[-1].response


def test_a_cut_answer_is_incomplete_and_a_cut_stream_fails() -> None:
    cut = [
        chunk({"role": "assistant", "content": ""}, completion_tokens=0),
        chunk({"content": "Once upon"}, finish="length", completion_tokens=2),
        chunk(completion_tokens=2, total_tokens=13),
        b"data: [DONE]\n\n",
    ]
    events, _ = stream_of(cut, max_output_tokens=2)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output[0].status == "incomplete"

    events, writer = stream_of(cut[:2])
    failed = writer.error_event("upstream failed mid-stream", "upstream_stream_cut")
    event = EVENTS.validate_json(failed.split(b"data: ", 1)[1], strict=True)
    assert event.type == "response.failed" and event.sequence_number == len(events)
    assert "upstream_stream_cut" in event.response.error.message
    assert event.response.usage.output_tokens == 2  # what was billed


def test_an_error_before_anything_was_sent_still_opens_the_response() -> None:
    writer = ResponseEventWriter(request(input="x"), REQUEST_ID, 1, "composer-2.5", "standard")
    blocks = writer.error_event("reached the maximum duration", "max_duration_exceeded")
    types = [EVENTS.validate_json(b.split(b"data: ")[1]).type for b in blocks.split(b"\n\n")[:-1]]
    assert types == ["response.created", "response.in_progress", "response.failed"]


def test_a_delta_with_characters_line_readers_break_at_stays_one_line() -> None:
    """JSON keeps U+2028 and U+0085 raw; str.splitlines (httpx's aiter_lines) breaks there."""
    tricky = "a\u2028b\u0085c"
    writer = ResponseEventWriter(request(input="x"), REQUEST_ID, 1, "composer-2.5", "fast")
    upstream = chunk(completion_tokens=0).replace(b'"choices": []', b'"choices": [{"index": 0, '
        b'"delta": {"content": "' + tricky.encode() + b'"}, "finish_reason": null}]')  # fmt: skip
    sent = b"".join(writer.feed(upstream)).decode()
    lines = [line for line in sent.splitlines() if line]
    assert lines and all(line.startswith(("event: ", "data: ")) for line in lines)
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [d["delta"] for d in data if d["type"] == "response.output_text.delta"] == [tricky]
