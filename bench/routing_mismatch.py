"""How often the trainer's MoE router picks other experts than the engine did, for the
same tokens and the same weights: the routing half of the train-inference mismatch.

vLLM (0.32) can return the experts it routed each token to (``--enable-return-routed-
experts``, which needs its V2 model runner, ``VLLM_USE_V2_MODEL_RUNNER=1``, and prefix
caching on), in a non-streaming chat completion's ``choices[0].routed_experts``: base64 of
a ``.npy`` array [tokens - 1, layers, top-k] for the prompt and the generated tokens but
the last. This script sends ``--requests`` chat completions to such an engine (with
``return_token_ids``), runs the trainer's model (``training.models.deepseek_v3``, loaded
from the same ``--model`` checkpoint the engine serves) over the same token ids, records
each MoE layer's top-k, and compares, per (token, MoE layer): the share where the two
expert sets differ, and the mean overlap of the sets.

    VLLM_USE_V2_MODEL_RUNNER=1 .venv/bin/vllm serve /tmp/tinymodel --port 18001 \\
        --served-model-name composer-2.5 --enable-prefix-caching \\
        --enable-return-routed-experts --max-model-len 4096 --enforce-eager
    .venv/bin/python bench/routing_mismatch.py --engine-url http://127.0.0.1:18001 \\
        --model /tmp/tinymodel

The CPU build here refuses that engine ("Model Runner V2 requires Triton"). Without
``--engine-url`` the script measures the part of the disagreement that precision alone
makes, as a stand-in: the trainer's model routing the same tokens in float32 (how it
trains) and in bfloat16 (how the engine serves), token ids from the checkpoint's own
tokenizer over the prompts below.
"""

from __future__ import annotations

import argparse
import base64
import io
from pathlib import Path

import httpx
import numpy as np
import torch
from tokenizers import Tokenizer

from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.moe import Router

PROMPTS = [
    "Reply with numbers only.",
    "Name one tool you would call to read a file.",
    "Write a haiku about gradient descent.",
    "What is 17 times 23?",
    "List three prime numbers.",
    "Explain a mixture of experts in one sentence.",
]


def engine_routing(url: str, prompt: str, max_tokens: int) -> tuple[list[int], np.ndarray]:
    """The token ids the engine saw and produced, and its experts [tokens - 1, L, k]."""
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "composer-2.5",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    reply.raise_for_status()
    body = reply.json()
    choice = body["choices"][0]
    if not choice.get("routed_experts"):
        raise SystemExit(
            "the engine returned no routed_experts: start it with "
            "--enable-return-routed-experts (and VLLM_USE_V2_MODEL_RUNNER=1)"
        )
    experts = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
    return body["prompt_token_ids"] + choice["token_ids"], experts


def trainer_routing(model: DeepseekV3Model, ids: list[int]) -> dict[int, torch.Tensor]:
    """Per MoE layer index: the trainer router's experts for each token [tokens, k]."""
    chosen: dict[int, torch.Tensor] = {}
    handles = []
    for index, layer in enumerate(model.model.layers[: model.config.num_hidden_layers]):
        router = getattr(layer.mlp, "gate", None)
        if not isinstance(router, Router):  # a dense layer
            continue

        def keep(_: object, __: object, out: tuple[torch.Tensor, torch.Tensor], i: int = index):
            chosen[i] = out[1].detach()

        handles.append(router.register_forward_hook(keep))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    return chosen


def precision_routing(model: DeepseekV3Model, ids: list[int]) -> tuple[dict, dict]:
    """The trainer's routing of ``ids`` in float32 and under bfloat16 autocast."""
    full = trainer_routing(model, ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = trainer_routing(model, ids)
    return full, half


def compare(
    first: dict[int, torch.Tensor], second: dict[int, np.ndarray]
) -> tuple[int, float, int]:
    """Over (token, MoE layer): how many expert sets differ, their summed overlap, pairs."""
    differ, overlap, pairs = 0, 0.0, 0
    for layer, picked in first.items():
        theirs = second[layer]
        for token in range(min(len(theirs), picked.shape[0])):
            a, b = set(picked[token].tolist()), set(np.asarray(theirs[token]).tolist())
            differ += a != b
            overlap += len(a & b) / len(a)
            pairs += 1
    return differ, overlap, pairs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", default="", help="an engine returning routed experts")
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint it serves")
    parser.add_argument("--requests", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=8, help="stand-in: prompt repeats")
    args = parser.parse_args()
    model = DeepseekV3Model.from_pretrained(args.model).eval()
    differ, overlap, pairs = 0, 0.0, 0
    for n in range(args.requests):
        prompt = PROMPTS[n % len(PROMPTS)]
        if args.engine_url:
            ids, experts = engine_routing(args.engine_url, prompt, args.max_tokens)
            engine = {layer: experts[:, layer, :] for layer in range(experts.shape[1])}
            result = compare(trainer_routing(model, ids[:-1]), engine)
        else:
            ids = tokenizer(args.model).encode(prompt, add_special_tokens=False).ids
            full, half = precision_routing(model, ids * args.repeat)
            result = compare(full, {k: v.numpy() for k, v in half.items()})
        differ, overlap, pairs = differ + result[0], overlap + result[1], pairs + result[2]
    against = "the engine" if args.engine_url else "bfloat16 (stand-in for the engine)"
    print(f"{args.requests} sequences, {pairs} (token, MoE layer) pairs, trainer vs {against}")
    print(f"expert sets differ: {differ / pairs:.2%}; mean overlap {overlap / pairs:.4f}")


def tokenizer(model: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model / "tokenizer.json"))


if __name__ == "__main__":
    main()
