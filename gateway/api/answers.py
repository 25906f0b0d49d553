"""A non-streaming answer built from vLLM's stream, in the shape vLLM answers it unstreamed.

The gateway asks vLLM for a stream (with continuous usage) even when the client asked for
one JSON answer: then the tokens generated so far are known as they come (a chunk of
``shaping.UNSTREAMED_STREAM_INTERVAL`` at a time), and a client that hangs up, or a request
that reaches its maximum duration, is billed for them (vLLM reports nothing for an
unstreamed request it aborts). The assembled answer has the keys and values of vLLM's own
non-streaming answer for chat and text completions: text or
message (content, tool calls), logprobs, finish and stop reasons, token ids, usage with
its details. One difference is vLLM's own: a tool call cut by ``max_tokens`` is a partial
call when streamed, where the unstreamed answer has the raw text as content.

Where vLLM's unstreamed answer breaks OpenAI's published schema
(``tests/gateway/openai_response_schema.json``), the assembled one follows the schema:
fields it lets be absent but not null (a message's ``annotations`` and ``function_call``,
usage details, ``system_fingerprint``) are left out when vLLM has none, and a chat
choice's logprobs carry ``refusal``. vLLM's own extra fields stay as vLLM answers them.
"""

from __future__ import annotations

from typing import Any

from gateway.api.answer_chunks import NO_ERROR, Choice, Chunk, read_chunk
from gateway.api.stream import UsageTally, drop_null_usage_details, event_payload, split_events


class Assembler:
    """Feed it the upstream's raw bytes; ``answer()`` once ``done``."""

    object_name = ""

    def __init__(self, choices_per_prompt: int | None) -> None:
        self._choices_per_prompt = choices_per_prompt
        self.reset()

    def reset(self) -> None:
        """Forget what was fed (the request is sent again, to another replica)."""
        self.tally = UsageTally(self._choices_per_prompt)
        self.done = False
        #: The error event vLLM sent in the stream, if any (``{"message", "code", ...}``).
        self.error: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self._buffer = b""

    @property
    def usage(self) -> dict[str, Any]:
        return self.tally.usage

    def feed(self, raw: bytes) -> None:
        events, self._buffer = split_events(self._buffer + raw)
        for event in events:
            payload = event_payload(event)
            if payload is None:
                continue
            if payload == b"[DONE]":
                self.done = True
                continue
            chunk = read_chunk(payload)
            if chunk is not None:
                self.chunk(chunk)

    def chunk(self, chunk: Chunk) -> None:
        if chunk.error is not NO_ERROR:
            error = chunk.error
            self.error = error if isinstance(error, dict) else {"message": str(error)}
            return
        head = self.head
        if not head:
            head.update(id=chunk.id, created=chunk.created, model=chunk.model)
        if chunk.system_fingerprint is not None:
            head["system_fingerprint"] = chunk.system_fingerprint
        if chunk.metrics is not None:
            head["metrics"] = chunk.metrics
        choices = chunk.choices
        usage = chunk.usage
        if usage and isinstance(usage, dict):
            self.tally.observe_indices(usage, [c.index for c in choices] if choices else None)
        for choice in choices or ():
            index = choice.index
            if not isinstance(index, int):
                index = 0
            state = self.choices.get(index)
            if state is None:
                state = self.choices[index] = self.new_choice(index)
            self.add(state, choice, chunk)
            if choice.finish_reason is not None:
                state["finish_reason"] = choice.finish_reason
                state["stop_reason"] = choice.stop_reason

    def new_choice(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def add(self, state: dict[str, Any], choice: Choice, chunk: Chunk) -> None:
        raise NotImplementedError

    def answer_usage(self) -> dict[str, Any]:
        usage = self.tally.usage
        prompt = _int(usage.get("prompt_tokens"))
        completion = _int(usage.get("completion_tokens"))
        reported: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": _int(usage.get("total_tokens")) or prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": usage.get("prompt_tokens_details"),
            "completion_tokens_details": usage.get("completion_tokens_details"),
        }
        drop_null_usage_details(reported)
        return reported

    def top(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.head.get("id"),
            "object": self.object_name,
            "created": self.head.get("created"),
            "model": self.head.get("model"),
            "choices": [self.finish(self.choices[i]) for i in sorted(self.choices)],
            # The relay sets the tier that served the request.
            "service_tier": None,
            "usage": self.answer_usage(),
        }
        if self.head.get("system_fingerprint") is not None:
            body["system_fingerprint"] = self.head["system_fingerprint"]
        return body

    def finish(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def answer(self) -> dict[str, Any]:
        raise NotImplementedError


class ChatAssembler(Assembler):
    object_name = "chat.completion"

    def __init__(self, tool_choice: object) -> None:
        # vLLM's unstreamed answer has content "" next to the calls of a named or required
        # tool choice, and the parser's content (None when it is empty) for "auto".
        self._forced_tools = tool_choice is not None and tool_choice not in ("auto", "none")
        super().__init__(None)

    def reset(self) -> None:
        super().reset()
        self.prompt_token_ids: Any = None

    def new_choice(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "role": "assistant",
            "content": None,
            "reasoning": None,
            "tool_calls": {},
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
            "token_ids": None,
        }

    def add(self, state: dict[str, Any], choice: Choice, chunk: Chunk) -> None:
        if self.prompt_token_ids is None and chunk.prompt_token_ids is not None:
            self.prompt_token_ids = chunk.prompt_token_ids
        delta = choice.delta
        if delta is not None:
            if delta.role:
                state["role"] = delta.role
            if isinstance(delta.content, str):
                _append(state, "content", delta.content)
            if isinstance(delta.reasoning, str):
                _append(state, "reasoning", delta.reasoning)
            if isinstance(delta.tool_calls, list):
                for call in delta.tool_calls:
                    _add_tool_call(state["tool_calls"], call)
        logprobs = choice.logprobs
        if isinstance(logprobs, dict):
            if state["logprobs"] is None:
                state["logprobs"] = {"content": [], "refusal": None}
            _extend(state["logprobs"]["content"], logprobs.get("content"))
        if choice.token_ids is not None:
            _extend_token_ids(state, choice.token_ids)

    def finish(self, state: dict[str, Any]) -> dict[str, Any]:
        calls = [state["tool_calls"][i] for i in sorted(state["tool_calls"])]
        content = _joined(state["content"])
        if calls and not content:
            content = "" if self._forced_tools else None
        message: dict[str, Any] = {
            "role": state["role"],
            "content": content,
            "refusal": None,
            "audio": None,
        }
        if calls:  # vLLM leaves an empty list out
            message["tool_calls"] = calls
        # Named as the stream names it (stream.mend_choices).
        message["reasoning_content"] = _joined(state["reasoning"])
        return {
            "index": state["index"],
            "message": message,
            "logprobs": state["logprobs"],
            "finish_reason": state["finish_reason"],
            "stop_reason": state["stop_reason"],
            "token_ids": state["token_ids"],
            "routed_experts": None,
        }

    def answer(self) -> dict[str, Any]:
        return {
            **self.top(),
            "prompt_logprobs": None,
            "prompt_token_ids": self.prompt_token_ids,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": self.head.get("metrics"),
        }


def _add_tool_call(calls: dict[int, dict[str, Any]], delta: Any) -> None:
    """A streamed tool call arrives as its id, type and name, then argument fragments."""
    if not isinstance(delta, dict):
        return
    call = calls.get(_index(delta))
    if call is None:
        call = calls[_index(delta)] = {
            "id": None,
            "type": "function",
            "function": {"name": "", "arguments": ""},
        }
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function")
    if not isinstance(function, dict):
        function = {}
    if isinstance(function.get("name"), str):
        call["function"]["name"] += function["name"]
    if isinstance(function.get("arguments"), str):
        call["function"]["arguments"] += function["arguments"]


class CompletionAssembler(Assembler):
    object_name = "text_completion"

    def new_choice(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "text": None,
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }

    def add(self, state: dict[str, Any], choice: Choice, chunk: Chunk) -> None:
        if isinstance(choice.text, str):
            _append(state, "text", choice.text)
        logprobs = choice.logprobs
        if isinstance(logprobs, dict):
            if state["logprobs"] is None:
                state["logprobs"] = {key: [] for key in _COMPLETION_LOGPROBS}
            for key in _COMPLETION_LOGPROBS:
                _extend(state["logprobs"][key], logprobs.get(key))
        if choice.token_ids is not None:
            _extend_token_ids(state, choice.token_ids)
        if state["prompt_token_ids"] is None and choice.prompt_token_ids is not None:
            state["prompt_token_ids"] = choice.prompt_token_ids

    def finish(self, state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "text": _joined(state["text"]) or ""}

    def answer(self) -> dict[str, Any]:
        return {
            **self.top(),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": self.head.get("metrics"),
        }


_COMPLETION_LOGPROBS = ("text_offset", "token_logprobs", "tokens", "top_logprobs")


def _append(state: dict[str, Any], key: str, text: str) -> None:
    """A streamed piece of text kept for the answer: pieces joined once at the end, not a
    growing string copied for every token."""
    parts = state[key]
    if parts is None:
        state[key] = [text]
    else:
        parts.append(text)


def _extend(kept: list[Any], more: object) -> None:
    if isinstance(more, list):
        kept.extend(more)


def _joined(parts: list[str] | None) -> str | None:
    return None if parts is None else "".join(parts)


def _extend_token_ids(state: dict[str, Any], ids: object) -> None:
    if isinstance(ids, list):
        if state["token_ids"] is None:
            state["token_ids"] = ids  # freshly parsed for this chunk: ours to extend
        else:
            state["token_ids"].extend(ids)


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _index(item: dict[str, Any]) -> int:
    index = item.get("index", 0)
    return index if isinstance(index, int) else 0
