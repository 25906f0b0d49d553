"""The tiny checkpoint: reproducible bytes, loadable by transformers."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from serving.tiny import build_tiny_checkpoint
from tests.support.commands import cstack_command


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_same_seed_same_bytes(tiny_model: Path, tmp_path: Path) -> None:
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    assert _digests(again) == _digests(tiny_model)


def test_other_seed_other_weights_same_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    other = _digests(build_tiny_checkpoint(tmp_path / "other", seed=1))
    base = _digests(tiny_model)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert other["tokenizer.json"] == base["tokenizer.json"]


def test_is_deepseek_v3_with_noaux_tc_bias(tiny_model: Path) -> None:
    import json

    from safetensors import safe_open

    config = json.loads((tiny_model / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["topk_method"] == "noaux_tc"
    # The smallest MLA sizes vLLM's CPU build accepts: kv_lora_rank 512 with rope 64.
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"]) == (512, 64)
    with safe_open(tiny_model / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    dense, moe = 0, config["first_k_dense_replace"]
    assert f"model.layers.{dense}.mlp.gate_proj.weight" in keys
    assert f"model.layers.{moe}.mlp.gate.e_score_correction_bias" in keys
    assert f"model.layers.{moe}.mlp.shared_experts.up_proj.weight" in keys
    for expert in range(config["n_routed_experts"]):
        assert f"model.layers.{moe}.mlp.experts.{expert}.down_proj.weight" in keys


def test_loads_in_transformers_and_generates(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert tokenizer.decode(tokenizer("def add(a, b):").input_ids) == "def add(a, b):"


def test_cli_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    for args, message in [
        (["--out", str(tmp_path / "m"), "--seed", "-1"], "seed must be a non-negative integer"),
        (["--out", str(tmp_path)], "exists and is not a checkpoint; refusing to replace it"),
    ]:
        result = subprocess.run(
            cstack_command("model", "build-tiny", *args), capture_output=True, text=True
        )
        assert result.returncode == 2
        assert result.stderr.startswith("error: ") and message in result.stderr
        assert "Traceback" not in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
