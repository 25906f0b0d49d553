"""The Response object built from vLLM's chat answer: its echo of the request, its output
items (reasoning, message, function calls), its status and its usage."""

from __future__ import annotations

from typing import Any

from gateway.api.answers import ChatAssembler
from gateway.api.responses.protocol import FunctionChoice, ResponsesRequest, TextConfig


def response_id(request_id: str) -> str:
    """``resp_`` and the request's id (``x-request-id``), so a response names its request."""
    return "resp_" + request_id.removeprefix("req_")


def skeleton(request: ResponsesRequest, request_id: str, created_at: int) -> dict[str, Any]:
    """The Response without its outcome: what the request asked for, as OpenAI echoes it.
    ``model``, ``service_tier``, ``status``, ``output`` and ``usage`` are set by the caller."""
    text = request.text or TextConfig()
    return {
        "id": response_id(request_id),
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": request.reasoning.effort if request.reasoning else None},
        "service_tier": None,
        "store": False,
        "temperature": request.temperature,
        "text": {
            "format": text.format.model_dump(by_alias=True, exclude_none=True)
            if text.format
            else {"type": "text"},
            "verbosity": text.verbosity,
        },
        "tool_choice": request.tool_choice.model_dump()
        if isinstance(request.tool_choice, FunctionChoice)
        else request.tool_choice or "auto",
        "tools": [tool.model_dump(by_alias=True) for tool in request.tools or ()],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def response_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Chat usage (what billing settles on) as the Responses API reports it."""
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    cached = _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    reasoning = _count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def finish_status(finish_reason: object) -> tuple[str, dict[str, str] | None]:
    """A Response's ``status`` and ``incomplete_details`` from chat's finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


_ITEM_PREFIXES = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def item_id(kind: str, request_id: str, output_index: int) -> str:
    """An output item's id: its kind, its request and its place in the output."""
    return f"{_ITEM_PREFIXES[kind]}_{request_id.removeprefix('req_')}_{output_index}"


class ResponseAssembler(ChatAssembler):
    """vLLM's chat stream assembled into one Response (the relay sets ``model`` and
    ``service_tier`` on it, as on a chat completion)."""

    def __init__(self, request: ResponsesRequest, request_id: str, created_at: int) -> None:
        super().__init__(request.tool_choice)
        self._skeleton = skeleton(request, request_id, created_at)
        self._request_id = request_id

    def answer(self) -> dict[str, Any]:
        choice = self.finish(self.choices[0]) if 0 in self.choices else None
        message = choice["message"] if choice else {}
        status, incomplete = finish_status(choice["finish_reason"] if choice else None)
        output: list[dict[str, Any]] = []
        rid = self._request_id
        if message.get("reasoning_content"):
            text = message["reasoning_content"]
            output.append(reasoning_item(item_id("reasoning", rid, len(output)), text))
        calls = message.get("tool_calls") or []
        if message.get("content") or not calls:
            text = message.get("content") or ""
            output.append(message_item(item_id("message", rid, len(output)), text, "completed"))
        for number, call in enumerate(calls):
            output.append(
                function_call_item(
                    item_id("function_call", rid, len(output)),
                    call.get("id") or f"call_{number}",
                    call["function"]["name"],
                    call["function"]["arguments"],
                    "completed",
                )
            )
        output[-1]["status"] = status  # the last item is what max_output_tokens cut
        return {
            **self._skeleton,
            "status": status,
            "incomplete_details": incomplete,
            "output": output,
            "usage": response_usage(self.tally.usage),
        }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}] if text else [],
        "status": status,
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; ``text`` None is one whose content part is not open yet."""
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text(text)],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0
