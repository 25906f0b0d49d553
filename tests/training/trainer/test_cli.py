"""`cstack train`: bad configurations fail before any process starts; a real torchrun run
trains, checkpoints and exports weights that load for serving."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "3", "--dp-shard", "2"], "world size 3 is not divisible by dp_shard=2"),
        (["--nproc", "2", "--ep", "4"], "world size 2 is not divisible by ep=4"),
        (["--nproc", "2", "--cp", "2", "--seq-len", "7"], "seq_len=7 is not divisible by cp=2"),
        (
            ["--nproc", "4", "--batch-size", "6"],
            "batch_size=6 is not divisible by the data-parallel degree world/cp=4",
        ),
        (["--ns-schedule", "cubic"], "--ns-schedule must be one of quintic, polar_express"),
    ],
)
def test_bad_config_fails_in_one_line(tiny_model: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["train", "--model", str(tiny_model), *args])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {message}"


def test_experts_not_divisible_by_ep(tmp_path: Path, tiny_model: Path) -> None:
    config = (
        (tiny_model / "config.json")
        .read_text()
        .replace('"n_routed_experts": 8', '"n_routed_experts": 6')
    )
    (tmp_path / "config.json").write_text(config)
    result = CliRunner().invoke(
        app, ["train", "--model", str(tmp_path), "--nproc", "4", "--ep", "4"]
    )
    assert result.exit_code == 2
    assert "n_routed_experts=6 is not divisible by ep=4" in result.output


def test_missing_model_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--model", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "is not a model directory" in result.output


@pytest.mark.distributed
def test_train_under_torchrun_checkpoints_and_exports(tiny_model: Path, tmp_path: Path) -> None:
    from training.models.deepseek_v3.model import DeepseekV3Model

    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "def add(a, b):\\n    return a + b\\n"}\n' * 20)
    command = [
        sys.executable, "-m", "deploy.cli", "train", "--model", str(tiny_model),
        "--data", str(data), "--nproc", "2", "--dp-shard", "2", "--ep", "2", "--steps", "2",
        "--batch-size", "2", "--seq-len", "16", "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--export-dir", str(tmp_path / "hf"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2/2 | loss" in done.stdout and "tokens/s" in done.stdout
    assert "optimizer" in done.stdout
    assert (tmp_path / "ckpt" / "step-00000002" / ".metadata").is_file()
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    exported = DeepseekV3Model.from_pretrained(tmp_path / "hf")
    original = DeepseekV3Model.from_pretrained(tiny_model)
    moved = exported.lm_head.weight - original.lm_head.weight
    assert moved.abs().max() > 0, "training changed the weights"
