"""The gateway's per-chunk JSON reads everything pydantic-core read, and writes JSON that
standard parsers read back to the same values."""

from __future__ import annotations

import json
import math

import pydantic_core
import pytest

from gateway.api import json_codec

CHUNK = (
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"h\\u00e9llo \\u2028 \\ud83d\\ude00"},'
    b'"logprobs":{"content":[{"token":"h","logprob":-0.0001234,"bytes":[104],'
    b'"top_logprobs":[]}]},"finish_reason":null}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}'
)


def test_a_chunk_reads_as_pydantic_core_reads_it_and_writes_back_the_same() -> None:
    data = json_codec.loads(CHUNK)
    assert data == pydantic_core.from_json(CHUNK)
    assert json.loads(json_codec.dumps(data)) == json.loads(CHUNK)


@pytest.mark.parametrize(
    "raw", [b'{"logprob": NaN}', b'{"logprob": -Infinity}', b'{"big": 123456789012345678901234567}']
)
def test_what_msgspec_refuses_is_read_as_before(raw: bytes) -> None:
    expected = pydantic_core.from_json(raw)
    value = json_codec.loads(raw)
    (key,) = expected
    if isinstance(expected[key], float) and math.isnan(expected[key]):
        assert math.isnan(value[key])
    else:
        assert value == expected


@pytest.mark.parametrize("raw", [b"{bad", b"", b'{"a": 1'])
def test_what_is_not_json_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json_codec.loads(raw)


def test_what_json_cannot_hold_is_written_as_null_not_as_a_bare_word() -> None:
    # Infinity is no JSON: a client's parser would refuse the whole event.
    assert json.loads(json_codec.dumps({"x": math.inf, "y": -math.inf})) == {"x": None, "y": None}
