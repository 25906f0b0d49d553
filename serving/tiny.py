"""Build the tiny checkpoints used in development, tests and CI.

Everything is made here, from a seed: random weights through transformers' own model
classes and a byte-level BPE tokenizer trained with ``tokenizers`` on a fixed corpus.
Nothing is downloaded. The sizes are the smallest that vLLM's CPU build accepts: head_dim
64 for attention, kv_lora_rank 512 with a rope head dim of 64 for MLA.

Two architectures share the tokenizer and chat template:

- ``deepseek_v3`` (the default): the composer-2.5 architecture, MLA attention, with one
  multi-token-prediction (MTP) layer that the fast variant drafts with.
- ``qwen3_moe``: a non-MLA MoE of the same size. vLLM's CPU build turns prefix caching off
  for MLA models, so this is the checkpoint that shows real cached input tokens on CPU
  (cached-token billing, prefix-aware routing); on GPUs the DeepSeek-V3 one caches too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|end_of_text|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
TOKENIZER_VOCAB = 1024
#: Kimi K2.5's thinking markers. Added after training (the two last ids) so that every
#: trained id stays what it was, and not special: they stay in the decoded text, where
#: vLLM's reasoning parser splits on them, and vLLM's thinking budget forces ``</think>``.
THINK_START, THINK_END = "<think>", "</think>"

# Hermes-style tool calls, so vLLM's `hermes` tool parser understands the model's output.
# Thinking as Kimi K2.5 does it: the ``thinking`` kwarg opens ``<think>`` in the generation
# prompt, and earlier assistant turns' reasoning is not rendered. Unlike K2.5, thinking is off
# unless asked for and renders nothing when off (K2.5 renders an empty ``<think></think>``),
# so prompts without thinking are the tokens they always were (RL rollouts and direct vLLM
# callers compare token ids). ``verbosity`` (low/high) adds a system line; medium adds nothing.
CHAT_TEMPLATE = (
    "{% if verbosity == 'low' %}<|im_start|>system\nAnswer tersely.<|im_end|>\n"
    "{% elif verbosity == 'high' %}<|im_start|>system\nAnswer in detail.<|im_end|>\n"
    "{% endif %}"
    "{% if tools %}<|im_start|>system\nYou can call these tools. Answer with "
    '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.\n<tools>\n'
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% elif message['content'] %}{% set text = message['content'] | map(attribute='text') "
    "| join('') %}{% else %}{% set text = '' %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ text }}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    '<tool_call>{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if thinking is defined and thinking %}<think>{% endif %}{% endif %}"
)

# A fixed corpus: the tokenizer depends on it alone, never on the seed or the machine.
_CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "import os\nimport sys\nfrom pathlib import Path\n",
    "Hello! How can I help you today? Please write a short poem about the sea.",
    "The model reads the prompt, thinks step by step and answers in plain English.",
    "for i in range(10):\n    print(i * i)\n",
    "if __name__ == '__main__':\n    main()\n",
    "Tokens are billed per million: input, cached input and output.",
    "Run the tests with pytest -q and fix the failing assertion.",
    '{"name": "read_file", "arguments": {"path": "src/app.py"}}',
    "<tool_call> </tool_call> <tools> </tools> system user assistant tool",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 -1 +1 = == != <= >= ( ) [ ] { } : ; , .",
    "Once upon a time there was a small model that learned to write code.",
    "Error: file not found. Traceback (most recent call last): ValueError: bad input",
]


def _corpus() -> list[str]:
    # Repetition with small variations gives BPE stable merge counts without randomness.
    return [f"{line} {i}" for i in range(40) for line in _CORPUS_LINES]


def train_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.add_tokens(
        [AddedToken(marker, special=False, normalized=False) for marker in (THINK_START, THINK_END)]
    )
    return tokenizer


ARCHITECTURES = ("deepseek_v3", "qwen3_moe")


# What both tiny architectures share: the same size, tokenizer-independent.
_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}


def tiny_qwen3_moe_config(vocab_size: int) -> dict[str, Any]:
    """A Qwen3-MoE of the DeepSeek-V3 checkpoint's size, with ordinary (non-MLA) attention."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": vocab_size,
        **_COMMON,
        "head_dim": 64,
        "num_experts": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def tiny_config(vocab_size: int) -> dict[str, Any]:
    """The DeepSeek-V3 hyper-parameters of the tiny checkpoint."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        **_COMMON,
        "first_k_dense_replace": 1,
        "q_lora_rank": 96,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 64,
        "v_head_dim": 64,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        # One multi-token-prediction layer, as DeepSeek-V3 has: the fast variant drafts with it.
        "num_nextn_predict_layers": 1,
    }


def build_tiny_checkpoint(
    out: Path,
    seed: int = 0,
    architecture: str = "deepseek_v3",
    report: Callable[[str], None] | None = None,
) -> Path:
    """Write a complete HF checkpoint to ``out``; the same seed gives the same bytes.

    ``report`` hears each phase as it begins (`cstack up` shows them).
    """
    import torch

    say = report or (lambda _phase: None)

    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}")
    out = Path(out)
    if out.exists():
        if any(out.iterdir()) and not (out / "config.json").exists():
            # Only ever replace a previous checkpoint, never an arbitrary directory.
            raise ValueError(f"{out} exists and is not a checkpoint; refusing to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True)

    say("training the tokenizer")
    tokenizer = train_tokenizer()
    special_ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    vocab_size = tokenizer.get_vocab_size()
    # Pad the embedding to a multiple of 64, as real checkpoints do.
    padded_vocab = (vocab_size + 63) // 64 * 64

    config_of = tiny_config if architecture == "deepseek_v3" else tiny_qwen3_moe_config
    cfg = config_of(padded_vocab)
    cfg.update(
        bos_token_id=special_ids[BOS],
        eos_token_id=special_ids[EOS],
        pad_token_id=special_ids[PAD],
    )
    say("making random weights")
    torch.manual_seed(seed)
    model = _random_model(cfg)
    say("writing the checkpoint")
    _save_quietly(model, out)
    if architecture == "deepseek_v3":
        say("adding the multi-token-prediction layer")
        _add_mtp_layer(cfg, out)

    # Rewrite config.json ourselves: deterministic key order, and the DeepSeek fields vLLM
    # reads (topk_method, scoring_func) that transformers' config class may not persist.
    saved = json.loads((out / "config.json").read_text())
    saved.update(cfg)
    saved["torch_dtype"] = "float32"
    saved.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    gen = {
        "bos_token_id": special_ids[BOS],
        "eos_token_id": special_ids[EOS],
        "pad_token_id": special_ids[PAD],
    }
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")

    tokenizer.save(str(out / "tokenizer.json"))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, sort_keys=True))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2)
    )
    return out


def _save_quietly(model: Any, out: Path) -> None:
    """``save_pretrained`` without transformers' progress bar: its stderr lines would tear
    through the live display of whoever reports the build's phases."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _add_mtp_layer(cfg: dict[str, Any], out: Path) -> None:
    """Add DeepSeek-V3's multi-token-prediction layer to the saved weights, under the names
    DeepSeek-V3's checkpoint uses (``model.layers.{num_hidden_layers}.*``, which
    transformers' model has no module for): ``enorm``, ``hnorm``, ``eh_proj``, a decoder
    block (MoE, as every layer from ``first_k_dense_replace`` on), ``shared_head.norm`` and
    the copies of the shared embedding and output head."""
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file

    layer, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    prefix = f"model.layers.{layer}."
    # A model one layer deeper, drawn after the main one from the same seeded generator:
    # its last layer is a random decoder block in the checkpoint's per-expert layout.
    with tempfile.TemporaryDirectory() as tmp:
        _save_quietly(_random_model({**cfg, "num_hidden_layers": layer + 1}), Path(tmp))
        deeper = load_file(str(Path(tmp) / "model.safetensors"))
    mtp = {key: tensor for key, tensor in deeper.items() if key.startswith(prefix)}
    mtp[prefix + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden) * cfg["initializer_range"]
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        mtp[f"{prefix}{norm}.weight"] = torch.ones(hidden)
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    # DeepSeek-V3 shares the embedding and the output head with its MTP layers; its
    # checkpoint still stores a copy of each under the layer's prefix.
    mtp[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    mtp[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file({**tensors, **mtp}, str(path), metadata={"format": "pt"})


def _random_model(cfg: dict[str, Any]) -> Any:
    import torch
    from transformers import (
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    values = {k: v for k, v in cfg.items() if k != "architectures"}
    if cfg["model_type"] == "qwen3_moe":
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**values)).eval()
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**values)).eval()
    with torch.no_grad():
        # transformers starts the routing bias at zero; a small seeded bias makes the
        # checkpoint exercise the noaux_tc correction path that vLLM must honour.
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape) * 0.01)
    return model
