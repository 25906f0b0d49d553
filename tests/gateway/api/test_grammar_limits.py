"""Schema patterns the engine's grammar compiler cannot take are refused before they reach
it, at the engine's own boundary (checked against the real vLLM)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.api.grammar_limits import MAX_EXPANSION, MAX_REPEAT, PatternTooComplex, check_patterns


def _schema(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}


@pytest.mark.parametrize(
    "pattern",
    ["^[a-z]{1,20}$", f"^a{{1,{MAX_REPEAT}}}$", "^(a{1,20}){1,20}$", "^a{2,}$", "(a|b)*c+",
     "[", "^\\p{L}+$"],
)  # fmt: skip
def test_patterns_within_the_limits_pass(pattern: str) -> None:
    check_patterns(_schema(pattern))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (f"^a{{1,{MAX_REPEAT + 1}}}$", f"a bounded repetition of {MAX_REPEAT + 1}"),
        ("^(a{1,200}){1,200}$", "a bounded repetition of 200"),
        ("^a{500,}$", "a bounded repetition of 500"),
        ("(x|y{1,300})", "a bounded repetition of 300"),
        ("^(a{1,50}){1,50}$", f"expand to 2500 (at most {MAX_EXPANSION})"),
        ("^(?=(b{1,40}){1,40})b$", "expand to 1600"),
    ],
)
def test_patterns_over_the_limits_are_refused_naming_where(pattern: str, why: str) -> None:
    schema = {"type": "array", "items": [{"type": "object", "patternProperties": {pattern: {}}}]}
    with pytest.raises(PatternTooComplex) as refused:
        check_patterns(schema, "schema")
    assert why in str(refused.value)
    assert str(refused.value).startswith("schema.items[0].patternProperties.")
    with pytest.raises(PatternTooComplex, match=r"^s\.properties\.a\.pattern: "):
        check_patterns(_schema(pattern), "s")


@pytest.mark.vllm
def test_the_limit_is_the_engines(vllm_url: str) -> None:
    """vLLM compiles a repetition of MAX_REPEAT and fails one more with a bare 500: if an
    engine upgrade moves the boundary, this says so."""
    model = httpx.get(f"{vllm_url}/v1/models", timeout=30).json()["data"][0]["id"]

    def engine_status(pattern: str) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": _schema(pattern)},
            },
        }
        return httpx.post(f"{vllm_url}/v1/chat/completions", json=body, timeout=120).status_code

    assert engine_status(f"^a{{1,{MAX_REPEAT}}}$") == 200
    assert engine_status(f"^a{{1,{MAX_REPEAT + 1}}}$") == 500
