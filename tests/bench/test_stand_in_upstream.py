"""The gateway benchmark's stand-in upstream (bench/stand_in_upstream.py) against the real
vLLM it stands in for: the same events, for the request bodies the gateway sends."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

STAND_IN = Path(__file__).resolve().parents[2] / "bench" / "stand_in_upstream.py"


def stand_in() -> Any:
    spec = importlib.util.spec_from_file_location("stand_in_upstream", STAND_IN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shape(events: list[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
    """Each event as (kind, tokens it adds, finish reason): what the gateway's work on a
    stream depends on, not the text."""
    shaped, made = [], 0
    for event in events:
        usage = event.get("usage") or {}
        tokens = usage.get("completion_tokens", made) - made
        made += tokens
        if not event["choices"]:
            shaped.append(("usage", tokens, None))
            continue
        (choice,) = event["choices"]
        kind = "role" if "role" in choice["delta"] else "tokens"
        shaped.append((kind, tokens, choice["finish_reason"]))
    return shaped


@pytest.mark.parametrize("interval", [1, 16])
def test_the_stand_in_streams_as_vllm_does_for_the_gateways_bodies(
    vllm_url: str, interval: int
) -> None:
    module = stand_in()
    body = {
        "model": "composer-2.5",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": module.ANSWER_TOKENS,
        "ignore_eos": True,
        "stream": True,
        # What the gateway always asks vLLM for (gateway.api.shaping).
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "stream_interval": interval,
    }
    events = []
    with httpx.stream("POST", f"{vllm_url}/v1/chat/completions", json=body, timeout=60) as sent:
        assert sent.status_code == 200
        for line in sent.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    real = shape(events)
    ours = shape(module.stream_events(interval, True, True))
    if interval > 1:
        assert ours == real  # the first token alone, the rest with the finish
    else:
        # vLLM leaves out a token whose text is not whole yet (the next event carries it):
        # the stand-in's token an event is the most events vLLM sends.
        assert [kind for kind, _, _ in real] == ["role"] + ["tokens"] * (len(real) - 2) + ["usage"]
        assert len(ours) >= len(real) and ours[0] == real[0] and ours[-1] == real[-1]
        assert ours[-2][2] == real[-2][2] == "length"
    assert sum(tokens for _, tokens, _ in real) == sum(tokens for _, tokens, _ in ours)
    # The stand-in's request detection reads the same fields from the gateway's bytes.
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert module.stream_for(raw) == module.stream_response(interval, True, True)
