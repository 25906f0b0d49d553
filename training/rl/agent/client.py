"""Policy calls through the OpenAI-compatible API, keeping vLLM's exact token ids.

``return_token_ids`` makes vLLM return the prompt ids it built from the chat template and
the completion ids it sampled; ``logprobs`` gives the logprob of each sampled token under
the sampling policy. The trainer recomputes the loss on exactly these ids.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any

import openai

from serving.vocabulary import ReasoningEffort, Verbosity
from training.rl.trajectory import ToolCall


class PolicyResponseError(RuntimeError):
    """The API answered without token ids or logprobs (a proxy dropped vLLM's fields)."""


@dataclass(frozen=True)
class SamplingConfig:
    model: str = "composer-2.5"
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    #: The gateway's chat-completions knobs; None: not sent (the model's default).
    reasoning_effort: ReasoningEffort | None = None
    verbosity: Verbosity | None = None


@dataclass(frozen=True)
class Completion:
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str


class PolicyClient:
    """One chat-completions call per turn with the real ``openai`` SDK."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        sampling: SamplingConfig,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
        )
        self.sampling = sampling

    def seeded(self, seed: int | None) -> PolicyClient:
        """The same connection, sampling with vLLM's per-request ``seed`` (None: unseeded)."""
        if seed is None:
            return self
        twin = copy.copy(self)
        twin.sampling = replace(
            self.sampling, extra_body={**self.sampling.extra_body, "seed": seed}
        )
        return twin

    def styled(
        self, reasoning_effort: ReasoningEffort | None, verbosity: Verbosity | None
    ) -> PolicyClient:
        """The same connection, asking for this effort and verbosity (None: leave as is)."""
        if reasoning_effort is None and verbosity is None:
            return self
        twin = copy.copy(self)
        twin.sampling = replace(
            self.sampling,
            reasoning_effort=reasoning_effort or self.sampling.reasoning_effort,
            verbosity=verbosity or self.sampling.verbosity,
        )
        return twin

    def close(self) -> None:
        self._client.close()

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        s = self.sampling
        style = {
            key: value
            for key, value in (("reasoning_effort", s.reasoning_effort), ("verbosity", s.verbosity))
            if value is not None
        }
        response = self._client.chat.completions.create(
            model=s.model,
            messages=messages,  # type: ignore[arg-type]
            # vLLM refuses an empty tool list: a tool-less turn omits the field.
            tools=tools or openai.NOT_GIVEN,  # type: ignore[arg-type]
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            logprobs=True,
            extra_body={"return_token_ids": True, **style, **s.extra_body},
        )
        choice = response.choices[0]
        prompt_ids = (response.model_extra or {}).get("prompt_token_ids")
        completion_ids = (choice.model_extra or {}).get("token_ids")
        content = choice.logprobs.content if choice.logprobs else None
        if prompt_ids is None or completion_ids is None or content is None:
            raise PolicyResponseError(
                "response lacks prompt_token_ids/token_ids/logprobs; the API must pass "
                "vLLM's return_token_ids and logprobs through"
            )
        logprobs = [entry.logprob for entry in content]
        if len(logprobs) != len(completion_ids):
            raise PolicyResponseError(
                f"{len(logprobs)} logprobs for {len(completion_ids)} completion tokens"
            )
        calls = [
            ToolCall(call_id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in choice.message.tool_calls or []
            if call.type == "function"
        ]
        return Completion(
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=list(completion_ids),
            logprobs=logprobs,
            text=choice.message.content or "",
            tool_calls=calls,
            finish_reason=choice.finish_reason or "",
        )
