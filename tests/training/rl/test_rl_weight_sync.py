"""Weight sync into the running vLLM: new weights change its outputs, the version advances,
the original weights restore them. Needs vLLM's dev endpoints (VLLM_SERVER_DEV_MODE=1)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import httpx
import pytest
import redis
import torch


def _greedy(vllm_url: str) -> list[int]:
    response = httpx.post(
        f"{vllm_url}/v1/chat/completions",
        json={"model": "composer-2.5", "messages": [{"role": "user", "content": "Count: 1 2 3"}],
              "max_tokens": 8, "temperature": 0.0, "return_token_ids": True},
        timeout=120,
    )  # fmt: skip
    response.raise_for_status()
    return list(response.json()["choices"][0]["token_ids"])


@pytest.mark.vllm
def test_push_changes_outputs_and_versions(
    vllm_url: str, redis_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    from training.model import DeepseekV3Model
    from training.rollouts import PolicyVersionGate, VllmWeightSync

    if httpx.get(f"{vllm_url}/is_paused", timeout=30).status_code == 404:
        pytest.skip("this vLLM runs without VLLM_SERVER_DEV_MODE=1 (no weight reload endpoints)")

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"sync-{uuid.uuid4().hex}")
    sync = VllmWeightSync([vllm_url], gate)
    original = _greedy(vllm_url)

    model = DeepseekV3Model.from_pretrained(tiny_model)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)  # a different policy, same architecture
    changed_dir = tmp_path / "changed"
    model.save_pretrained(changed_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json"):  # fmt: skip
        if (tiny_model / name).exists():
            shutil.copy2(tiny_model / name, changed_dir / name)

    try:
        assert sync.push(changed_dir) == 1
        assert sync.engine_version(vllm_url) == "1"
        assert _greedy(vllm_url) != original
    finally:
        assert sync.push(tiny_model) == 2  # leave the shared engine as we found it
    assert sync.engine_version(vllm_url) == "2"
    assert _greedy(vllm_url) == original
