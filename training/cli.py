"""`cstack train`: validate the configuration here, then start torchrun workers.

Everything that can be checked without processes (world size vs. mesh factors, experts
vs. EP, sequence vs. CP, files) is checked in this process, so a bad configuration fails
in a second with one line naming the constraint instead of N tracebacks.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

SCHEDULES = ("quintic", "polar_express")
SCALE_RULES = ("spectral", "match_adamw")


def train(
    model: Annotated[Path, typer.Option(help="HF checkpoint directory to start from.")],
    data: Annotated[
        Path | None,
        typer.Option(help="JSONL with 'text' or 'input_ids' per line; default: random tokens."),
    ] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps to reach.")] = 10,
    batch_size: Annotated[int, typer.Option(help="Samples per step, over all ranks.")] = 8,
    seq_len: Annotated[int, typer.Option(help="Tokens per sample.")] = 64,
    nproc: Annotated[int, typer.Option(help="Processes (ranks) on this machine.")] = 1,
    nnodes: Annotated[int, typer.Option(help="Machines; more than 1 needs --rdzv-endpoint.")] = 1,
    rdzv_endpoint: Annotated[
        str | None, typer.Option(help="host:port of the rendezvous (multi-node).")
    ] = None,
    dp_shard: Annotated[int, typer.Option(help="FSDP shard group size (dense weights).")] = 1,
    cp: Annotated[int, typer.Option(help="Context-parallel group size.")] = 1,
    ep: Annotated[int, typer.Option(help="Expert-parallel group size.")] = 1,
    lr: Annotated[float, typer.Option(help="Muon learning rate.")] = 0.02,
    adamw_lr: Annotated[float, typer.Option(help="AdamW learning rate (embeddings, ...).")] = 3e-4,
    weight_decay: Annotated[float, typer.Option(help="Muon decoupled weight decay.")] = 0.0,
    ns_schedule: Annotated[str, typer.Option(help="quintic or polar_express.")] = "quintic",
    scale_rule: Annotated[str, typer.Option(help="spectral or match_adamw.")] = "spectral",
    grad_clip: Annotated[float, typer.Option(help="Global gradient norm limit (0: off).")] = 1.0,
    bf16: Annotated[bool, typer.Option(help="bf16 autocast for forward and backward.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for data order and initialisation.")] = 0,
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="DCP checkpoints; resumes from the latest one here.")
    ] = None,
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 0,
    export_dir: Annotated[
        Path | None, typer.Option(help="Write HF-format weights for serving at the end.")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics from rank 0 on this port.")
    ] = None,
) -> None:
    """Train the model with Muon on (dense HSDP, expert, CP) meshes under torchrun.

    Resumes from the newest checkpoint in --checkpoint-dir; prints loss, tokens/s and
    optimizer step time per step.
    """
    from training.mesh import ParallelConfig
    from training.muon import MuonConfig
    from training.newton_schulz import NewtonSchulzConfig
    from training.settings import TrainingSettings
    from training.trainer_config import TrainerConfig

    settings = TrainingSettings()
    if ns_schedule not in SCHEDULES:
        _fail(f"--ns-schedule must be one of {', '.join(SCHEDULES)}")
    if scale_rule not in SCALE_RULES:
        _fail(f"--scale-rule must be one of {', '.join(SCALE_RULES)}")
    if nnodes > 1 and not rdzv_endpoint:
        _fail("--nnodes > 1 needs --rdzv-endpoint host:port")
    config = TrainerConfig(
        model_path=model,
        data_path=data,
        batch_size=batch_size,
        seq_len=seq_len,
        steps=steps,
        seed=seed,
        grad_clip=grad_clip,
        bf16=bf16,
        optimizer=MuonConfig(
            lr=lr,
            adamw_lr=adamw_lr,
            weight_decay=weight_decay,
            newton_schulz=NewtonSchulzConfig(schedule=ns_schedule),
            scale_rule=scale_rule,  # type: ignore[arg-type]
        ),
        parallel=ParallelConfig(world_size=nproc * nnodes, dp_shard=dp_shard, cp=cp, ep=ep),
        checkpoint_dir=checkpoint_dir or settings.train_checkpoint_dir,
        checkpoint_every=checkpoint_every,
        export_dir=export_dir,
        metrics_port=metrics_port if metrics_port is not None else settings.trainer_metrics_port,
    )
    try:
        config.validate()
    except (ValueError, OSError) as exc:
        _fail(str(exc))

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(config.to_json())
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        command.append("--standalone")
    else:
        command += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
    command += ["-m", "training.launch", handle.name]
    try:
        code = subprocess.call(command)
    finally:
        Path(handle.name).unlink(missing_ok=True)
    if code != 0:
        typer.echo(f"error: training failed (torchrun exit status {code})", err=True)
        raise typer.Exit(1)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
