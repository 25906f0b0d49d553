"""The trainer's model computes what the session's vLLM serves from the same checkpoint,
and a checkpoint the trainer saves is, tensor for tensor, the one vLLM serves.

This uses the session's one vLLM (the ``vllm_url`` fixture, seed-0 tiny checkpoint); it
does not start another. Loading a *modified* saved checkpoint into a running vLLM is the
serving package's weight-reload path and is tested there.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from training.models.deepseek_v3.model import DeepseekV3Model

PROMPT = [1, 40, 300, 77, 512, 9, 123, 600, 5, 250, 31, 88]


@pytest.mark.vllm
def test_prompt_logprobs_match_vllm(vllm_url: str, tiny_model: Path) -> None:
    request = {
        "model": "composer-2.5",
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
    }
    reply = httpx.post(f"{vllm_url}/v1/completions", json=request, timeout=120)
    reply.raise_for_status()
    served = reply.json()["choices"][0]["prompt_logprobs"]
    model = DeepseekV3Model.from_pretrained(tiny_model).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([PROMPT])), dim=-1)[0]
    for position in range(1, len(PROMPT)):
        ours = float(logprobs[position - 1, PROMPT[position]])
        theirs = served[position][str(PROMPT[position])]["logprob"]
        # vLLM's CPU profile serves in bf16; the trainer computes in fp32.
        assert ours == pytest.approx(theirs, abs=2e-2), position


def test_saved_checkpoint_is_the_served_one(tiny_model: Path, tmp_path: Path) -> None:
    DeepseekV3Model.from_pretrained(tiny_model).save_pretrained(tmp_path)
    served = load_file(str(tiny_model / "model.safetensors"))
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved.keys() == served.keys()
    for key, tensor in served.items():
        assert torch.equal(saved[key], tensor), key
