"""vLLM's chat stream as the Responses API's stream of events.

Each event is ``event: <type>`` plus its JSON with a ``sequence_number``, in the order
OpenAI sends them: ``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, its content part's ``added``, text deltas and ``done``
(``response.reasoning_text.*`` for reasoning, ``response.output_text.*`` for the answer,
``response.function_call_arguments.*`` for a tool call), ``response.output_item.done``;
then ``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut the
answer) carrying the whole Response with its usage. A stream that fails (vLLM's in-stream
error, an upstream cut, the gateway's maximum duration) ends with ``response.failed``,
whose Response carries the error and the usage billed until then.

Billing settles on ``usage``: chat usage from vLLM's continuous usage stats, exactly as
for a chat stream (``gateway.api.stream.UsageTally``).
"""

from __future__ import annotations

from typing import Any

from gateway.api import json_codec
from gateway.api.responses.output import (
    finish_status,
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    response_usage,
    skeleton,
)
from gateway.api.responses.protocol import ResponsesRequest
from gateway.api.stream import (
    COST_FIELD,
    UsageCost,
    UsageTally,
    event_json,
    event_payload,
    split_events,
)
from serving.vocabulary import ANSWER_SERVICE_TIERS, Tier

#: Per text-bearing item kind: its content part, and the prefix of its text events.
_PARTS = {"reasoning": "reasoning_text", "message": "output_text"}


class ResponseEventWriter:
    """Feed it vLLM's raw chat stream; it returns the Responses events to send on."""

    def __init__(
        self,
        request: ResponsesRequest,
        request_id: str,
        created_at: int,
        public_model: str,
        tier: Tier,
        cost: UsageCost | None = None,
    ) -> None:
        #: The request's cost from its chat usage, for the Response's final ``usage``.
        self._cost = cost
        self._response = {
            **skeleton(request, request_id, created_at),
            "model": public_model,
            "service_tier": ANSWER_SERVICE_TIERS[tier],
        }
        self._request_id = request_id
        #: What billing settles on.
        self.tally = UsageTally()
        self.done = False
        #: vLLM sent an error event in the stream.
        self.failed = False
        self._buffer = b""
        self._sequence = 0
        self._started = False
        self._output: list[dict[str, Any]] = []
        #: The item receiving text (reasoning, message or function call), its output index,
        #: and its text so far in pieces (joined when it closes: appending to a string in a
        #: dict would copy the whole text at every delta).
        self._open: tuple[dict[str, Any], int] | None = None
        self._pieces: list[str] = []
        #: Function call items by chat's tool call index: (item, output index).
        self._calls: dict[int, tuple[dict[str, Any], int]] = {}
        self._finish_reason: object = None

    @property
    def usage(self) -> dict[str, Any]:
        return self.tally.usage

    def feed(self, raw: bytes) -> list[bytes]:
        out = self._start()
        events, self._buffer = split_events(self._buffer + raw)
        for event in events:
            payload = event_payload(event)
            if payload is None or self.done or self.failed:
                continue
            if payload == b"[DONE]":
                self.done = True
                out.extend(self._complete())
                continue
            try:
                data = json_codec.loads(payload)
            except ValueError:
                continue
            if not isinstance(data, dict):
                continue
            if "error" in data:
                self.failed = True
                error = data["error"]
                message = error.get("message") if isinstance(error, dict) else None
                out.append(self.error_event(str(message or "upstream error"), "upstream_error"))
                continue
            usage, choices = data.get("usage"), data.get("choices")
            if isinstance(usage, dict) and usage:
                self.tally.observe(usage, choices)
            for choice in choices if isinstance(choices, list) else ():
                if isinstance(choice, dict):
                    out.extend(self._choice(choice))
        return out

    def error_event(self, message: str, code: str) -> bytes:
        """``response.failed`` (after ``response.created``, if nothing was sent yet).
        OpenAI's error codes do not name ours: ``code`` is in the message."""
        start = b"".join(self._start())
        response = self._snapshot(
            "failed", error={"code": "server_error", "message": f"{message} ({code})"}
        )
        return start + self._event("response.failed", response=response)

    # --- internals -------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + event_json(body) + b"\n\n"

    def _snapshot(self, status: str, **fields: Any) -> dict[str, Any]:
        self._flush()
        usage = response_usage(self.tally.usage) if status != "in_progress" else None
        if usage is not None and self._cost is not None:
            priced = self._cost(self.tally.usage)
            if priced is not None:
                usage[COST_FIELD] = priced
        output = self._output
        return {**self._response, "status": status, "output": output, "usage": usage, **fields}

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def _choice(self, choice: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            # vLLM's name for the reasoning delta (the chat relay renames it).
            for kind, key in (("reasoning", "reasoning"), ("message", "content")):
                text = delta.get(key)
                if isinstance(text, str) and text:
                    out.extend(self._text(kind, text))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.extend(self._tool_call(call))
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
        return out

    def _add_item(self, item: dict[str, Any]) -> tuple[list[bytes], int]:
        index = len(self._output)
        self._output.append(item)
        return [self._event("response.output_item.added", output_index=index, item=item)], index

    def _text(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._open is None or self._open[0]["type"] != kind:
            out.extend(self._close_open("completed"))
            index = len(self._output)
            identity = item_id(kind, self._request_id, index)
            item = (
                reasoning_item(identity, "", "in_progress")
                if kind == "reasoning"
                else message_item(identity, None, "in_progress")
            )
            added, index = self._add_item(item)
            out.extend(added)
            part = output_text("") if kind == "message" else {"type": "reasoning_text", "text": ""}
            out.append(self._part_event("added", item, index, part))
            item["content"] = [part]
            self._open = (item, index)
        item, index = self._open
        self._pieces.append(text)
        fields: dict[str, Any] = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "message":
            fields["logprobs"] = []
        out.append(self._event(f"response.{_PARTS[kind]}.delta", delta=text, **fields))
        return out

    def _part_event(
        self, stage: str, item: dict[str, Any], index: int, part: dict[str, Any]
    ) -> bytes:
        return self._event(
            f"response.content_part.{stage}",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )

    def _flush(self) -> None:
        """The open item's text so far into the item (for a snapshot, or as it closes)."""
        if self._open is None:
            return
        item, text = self._open[0], "".join(self._pieces)
        if item["type"] == "function_call":
            item["arguments"] = text
        else:
            item["content"][0]["text"] = text

    def _close_open(self, status: str) -> list[bytes]:
        """Close the open item (its text's ``done``, its part's, its own) as ``status``."""
        if self._open is None:
            return []
        self._flush()
        item, index = self._open
        self._open, self._pieces = None, []
        item["status"] = status
        out: list[bytes]
        if item["type"] == "function_call":
            out = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"], output_index=index,
                    name=item["name"], arguments=item["arguments"],
                )
            ]  # fmt: skip
        else:
            kind, part = item["type"], item["content"][0]
            fields: dict[str, Any] = {
                "item_id": item["id"], "output_index": index, "content_index": 0
            }  # fmt: skip
            if kind == "message":
                fields["logprobs"] = []
            out = [
                self._event(f"response.{_PARTS[kind]}.done", text=part["text"], **fields),
                self._part_event("done", item, index, part),
            ]
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _tool_call(self, call: dict[str, Any]) -> list[bytes]:
        """A call opens when its first delta arrives and closes when the next item opens
        (vLLM streams one call after the other); a late delta of a closed call is dropped."""
        out: list[bytes] = []
        number = call.get("index", 0)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        if number not in self._calls:
            out.extend(self._close_open("completed"))
            index = len(self._output)
            item = function_call_item(
                item_id("function_call", self._request_id, index),
                str(call.get("id") or f"call_{number}"),
                str(function.get("name") or ""),
                "",
                "in_progress",
            )
            added, index = self._add_item(item)
            out.extend(added)
            self._calls[number] = (item, index)
            self._open = (item, index)
        item, index = self._calls[number]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and self._open == (item, index):
            self._pieces.append(arguments)
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=arguments,
                )
            )
        return out

    def _complete(self) -> list[bytes]:
        status, incomplete = finish_status(self._finish_reason)
        out = self._close_open(status)  # the last item: what max_output_tokens cut
        if not self._output:  # nothing generated: an empty answer is still a message
            item = message_item(item_id("message", self._request_id, 0), "", status)
            added, index = self._add_item(item)
            out.extend(added)
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        kind = "response.completed" if status == "completed" else "response.incomplete"
        response = self._snapshot(status, incomplete_details=incomplete)
        out.append(self._event(kind, response=response))
        return out
