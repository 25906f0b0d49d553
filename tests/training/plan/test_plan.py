"""`cstack plan`: the report for a preset, its memory and Muon model against the real
sharded model, and one-line errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from tests.support.spawn import run_ranks
from training.cli import plan as plan_command
from training.distributed.config import ParallelConfig
from training.distributed.mesh import build_meshes
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.parallelize import parallelize
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.muon import build_optimizer, matrix_layouts
from training.optim.newton_schulz import uses_gram
from training.optim.sharded_muon import ShardedOrthogonalizer
from training.plan.muon_step import muon_step
from training.plan.parts import Layout, shape_key
from training.plan.plan import (
    CALIBRATION_FILE,
    PlanConfig,
    load_device,
    load_model_config,
    local_numel,
    model_params,
    plan,
)

SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=3, first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=16,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
)  # fmt: skip


def _cli(*args: str) -> typer.testing.Result:
    # The command as training.cli declares it (deploy.cli mounts it as `cstack plan`).
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.command("help")(lambda: None)  # a second command keeps `plan` a subcommand
    return CliRunner().invoke(app, ["plan", *args])


def _values(report: str, label: str) -> list[str]:
    """The columns of the report's row ``label`` (dual mesh, shared mesh)."""
    line = next(line.strip() for line in report.splitlines() if line.strip().startswith(label))
    return line[len(label) :].split()


def _gram_flops(rows: int, cols: int) -> int:
    """5 steps, restart before the third: 8 s^2 l + 28 s^3, or the standard iteration's
    20 s^2 l + 10 s^3 where that is less (by hand, from the derivation in newton_schulz)."""
    s, large = min(rows, cols), max(rows, cols)
    return min(8 * s * s * large + 28 * s**3, 20 * s * s * large + 10 * s**3)


def test_report_for_the_1t_preset() -> None:
    result = _cli("--model", "kimi-k2", "--gpus", "384", "--gpu", "h200")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "kimi-k2: 1,026.4B parameters (1,014.7B in 384 routed experts" in out
    for heading in ("memory per GPU (GB)", "Newton-Schulz per GPU per step (TFLOP)",
                    "all-to-all per GPU per step (GB sent", "Muon optimizer step (s",
                    "predicted, with overlap", "predicted, no overlap", "dual mesh",
                    "shared mesh", "0.2 s (announcement)", "157 ms (Megatron-LM)",
                    "Where the time goes", "Other optimizer settings",
                    "optimizer (the trainer defaults): Newton-Schulz float16, Gram",
                    "Figures for h200 (measured or assumed):",
                    "newton_schulz_flops: assumed: 75% of the specification's peak"):  # fmt: skip
        assert heading in out, heading
    # Every Muon matrix of kimi-k2, counted by hand: 61 layers of q_a, kv_a and 64 heads of
    # q_b, kv_b and o_proj; layer 0's dense MLP; 60 MoE layers of a shared expert and 384
    # routed experts (gate, up, down each).
    per_layer = (
        _gram_flops(1536, 7168)
        + _gram_flops(576, 7168)
        + 64 * (_gram_flops(192, 1536) + _gram_flops(256, 512) + _gram_flops(7168, 128))
    )
    expert = _gram_flops(2048, 7168)
    total = (61 * per_layer + 3 * _gram_flops(18432, 7168) + 60 * 3 * expert
             + 60 * 384 * 3 * expert)  # fmt: skip
    assert _values(out, "even split (total / GPUs)") == [f"{total / 384 / 1e12:.2f}"] * 2
    # Every rank busy: no rank more than two expert matrices above the even split.
    for e in plan(PlanConfig(model="kimi-k2", gpus=384, gpu="h200")).estimates:
        assert e.step.ns_flops.max() <= total / 384 + 2 * expert, e.layout.name
    # The defaults meet the announced step.
    dual, _ = (float(v) for v in _values(out, "predicted, with overlap"))
    assert dual <= 0.2
    assert f"the dual mesh predicts {dual:.3f} s with overlap" in out


def test_the_plan_follows_the_options_given() -> None:
    result = _cli("--model", "kimi-k2", "--gpus", "384", "--ns-dtype", "float32",
                  "--ns-method", "standard")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "optimizer: Newton-Schulz float32, standard, 5 steps; job-wide owners" in result.output
    # float32 runs without tensor cores: 50 against 740 TFLOP/s assumed.
    dual, _ = (float(v) for v in _values(result.output, "predicted, with overlap"))
    assert dual > 1.0


def test_shared_mesh_needs_cp_times_ep_gpus() -> None:
    result = _cli("--model", "deepseek-v3", "--gpus", "8", "--ep", "8", "--cp", "2")
    assert result.exit_code == 0, result.output
    assert _values(result.output, "GPUs") == ["8", "16"]
    assert "does not fit" in result.output  # 671B on 8 GPUs


def test_presets_have_the_published_sizes() -> None:
    # DeepSeek-V3: 671B and its 14B MTP layer, as its report counts them.
    for name, billions in (("deepseek-v3", 685), ("kimi-k2", 1026)):
        total = sum(p.numel for p in model_params(load_model_config(name)))
        assert abs(total / 1e9 - billions) < 0.01 * billions, (name, total)


def test_parameters_and_optimizer_split_are_the_models() -> None:
    model = DeepseekV3Model(SMALL)
    params = {p.name: p for p in model_params(SMALL)}
    assert {n: p.shape for n, p in params.items()} == {
        n: tuple(t.shape) for n, t in model.named_parameters()
    }
    layouts, adamw = matrix_layouts(model)
    names = {id(t): n for n, t in model.named_parameters()}
    assert {names[id(t)] for t in layouts} == {n for n, p in params.items() if p.muon}
    assert {names[id(t)] for t in adamw} == {n for n, p in params.items() if not p.muon}
    groups = build_optimizer(model).param_groups
    assert sum(t.numel() for t in groups[0]["params"]) == sum(
        p.numel for p in params.values() if p.muon
    )


def _sharded_worker(rank: int, world: int) -> None:
    parallel = ParallelConfig(world_size=world, dp_shard=2, ep=2)
    model = DeepseekV3Model(SMALL)
    model.init_weights(0)
    parallelize(model, build_meshes(parallel, "cpu"))
    layout = Layout("dual mesh", world, parallel.dp_shard, parallel.ep, parallel.cp)
    planned = {p.name: p for p in model_params(SMALL)}
    for name, tensor in model.named_parameters():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        assert local.numel() == local_numel(planned[name], layout, rank), name

    # Sharded Muon's real exchange and Newton-Schulz work equal the plan's, rank by rank.
    device = load_device(PlanConfig(gpu="cpu"))
    for muon in (MuonConfig(), MuonConfig(owners="shard_group")):
        layouts, _ = matrix_layouts(model)
        params = list(layouts)
        runner = ShardedOrthogonalizer(params, [layouts[p] for p in params], muon)
        generator = torch.Generator().manual_seed(rank)
        runner.run([torch.randn(p.to_local().shape, generator=generator) for p in params])  # type: ignore[attr-defined]
        adamw = np.zeros(world)
        step = muon_step(list(planned.values()), layout, device, muon, adamw)
        assert runner.stats.newton_schulz_flops == step.ns_flops[rank]
        assert runner.stats.bytes_sent == step.sent_bytes[rank]


@pytest.mark.distributed
def test_memory_and_muon_model_match_the_sharded_model() -> None:
    run_ranks(_sharded_worker, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "x"], "--model x: not a preset (deepseek-v3, kimi-k2) nor a config file"),
        (["--gpus", "12"], "world size 12 is not divisible by dp_shard=8"),
        (["--gpus", "64", "--ep", "48"], "world size 64 is not divisible by ep=48"),
        (["--gpus", "512", "--ep", "512"], "n_routed_experts=384 is not divisible by ep=512"),
        (["--gpu", "a100"], "--gpu a100: not in calibration.yaml (cpu, h100, h200)"),
        (["--ns-dtype", "int8"], "--ns-dtype must be one of float32, bfloat16, float16"),
        (["--calibration", "/nonexistent.yaml"], "--calibration /nonexistent.yaml: not a "
         "calibration file ([Errno 2] No such file or directory: '/nonexistent.yaml')"),
        (["--gpus", "0"], "--gpus must be >= 1"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {message}"


def test_a_calibration_file_without_a_figure_is_one_line(tmp_path: Path) -> None:
    devices = yaml.safe_load(CALIBRATION_FILE.read_text())["devices"]
    del devices["h200"]["newton_schulz_flops"]["float16"]
    del devices["h100"]["basis"]
    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump({"devices": devices}))
    for gpu, message in (("h200", "no newton_schulz_flops for float16"),
                         ("h100", "missing basis")):  # fmt: skip
        result = _cli("--gpu", gpu, "--calibration", str(path))
        assert result.exit_code == 2
        assert result.output.strip() == f"error: --calibration {path}: device {gpu}: {message}"


def test_a_config_file_is_a_model(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "config.json"  # type: ignore[operator]
    path.write_text('{"hidden_size": 64, "n_routed_experts": 6}')
    result = _cli("--model", str(path), "--gpus", "8", "--dp-shard", "2", "--gpu", "cpu")
    assert result.exit_code == 0, result.output
    assert "dense group / EP / CP" in result.output
    assert "2 / 2 / 1" in result.output  # EP: the widest dividing 8 GPUs and 6 experts


def test_the_device_run_writes_the_calibration_the_plan_uses(tmp_path: Path) -> None:
    """bench/muon.py --part calibrate in its reduced mode on CPU: one command measures and
    writes a device's figures, keeps the others, and cstack plan reads them as measured."""
    out = tmp_path / "calibration.yaml"
    shutil.copy(CALIBRATION_FILE, out)
    root = Path(__file__).resolve().parents[3]
    command = [sys.executable, "bench/muon.py", "--part", "calibrate", "--reduced",
               "--repeats", "1", "--device-name", "dev", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    written = yaml.safe_load(out.read_text())["devices"]
    shipped = yaml.safe_load(CALIBRATION_FILE.read_text())["devices"]
    assert {k: v for k, v in written.items() if k != "dev"} == shipped
    dev = written["dev"]
    for figure in ("newton_schulz_flops", "memory_bandwidth", "intra_node_bandwidth"):
        assert dev["basis"][figure].startswith("measured "), figure
        assert "bench/muon.py --part calibrate" in dev["basis"][figure]
    assert dev["basis"]["inter_node_bandwidth"].startswith("assumed")
    # A rate for every Muon matrix shape of the bench's small model, in each precision, for
    # the standard iteration and, where it is cheaper, Gram's.
    bench_model = ModelConfig(
        vocab_size=1024, hidden_size=128, intermediate_size=384, moe_intermediate_size=64,
        num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4, q_lora_rank=96,
        kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        n_routed_experts=16, num_experts_per_tok=2,
    )  # fmt: skip
    shapes = {p.matrix for p in model_params(bench_model) if p.muon}
    for rows, cols in shapes:
        for dtype in ("float32", "bfloat16", "float16"):
            assert dev["newton_schulz_shapes"][shape_key(rows, cols, dtype, False)] > 0
            gram = uses_gram(rows, cols, NewtonSchulzConfig(method="gram"))
            assert (shape_key(rows, cols, dtype, True) in dev["newton_schulz_shapes"]) == gram
    assert dev["sharded_step"]["measured_s"] > 0 and dev["sharded_step"]["predicted_s"] > 0

    result = _cli("--model", "kimi-k2", "--gpus", "8", "--dp-shard", "2", "--gpu", "dev",
                  "--calibration", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Figures for dev (measured or assumed):" in result.output
    assert "  memory_bandwidth: measured " in result.output
    assert "check: a sharded Muon step measured" in result.output
