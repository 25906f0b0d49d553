"""`cstack train`: validate the configuration here, then start torchrun workers; and
`cstack plan`: what a layout costs per GPU before it runs (training.plan.plan).

Everything that can be checked without processes (world size vs. mesh factors, experts
vs. EP, sequence vs. CP, files) is checked in this process, so a bad configuration fails
in a second with one line naming the constraint instead of N tracebacks. The options are
the fields of ``TrainerConfig`` (and its nested configs) declared with help text, plus
the launcher's own (``LaunchConfig``).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer

from training.plan.plan import PlanConfig, PlanError
from training.plan.report import report
from training.settings import TrainingSettings
from training.trainer.config import TrainerConfig
from training.trainer.options import build_config, check_choices, cli_options, option, typer_command


@dataclass(frozen=True)
class LaunchConfig:
    """Where the ranks run: torchrun's side of ``cstack train``."""

    nproc: int = option(1, "Processes (ranks) on this machine.")
    nnodes: int = option(1, "Machines; more than 1 needs --rdzv-endpoint.")
    rdzv_endpoint: str | None = option(None, "host:port of the rendezvous (multi-node).")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def torchrun_command(self, config_file: str) -> list[str]:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.nproc}"]
        if self.nnodes == 1:
            command.append("--standalone")
        else:
            command += [
                f"--nnodes={self.nnodes}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.rdzv_endpoint}",
            ]
        return [*command, "-m", "training.trainer.launch", config_file]


TRAINER_OPTIONS = cli_options(TrainerConfig)
LAUNCH_OPTIONS = cli_options(LaunchConfig)
PLAN_OPTIONS = cli_options(PlanConfig)


def _train(values: dict[str, Any]) -> None:
    error = check_choices(TRAINER_OPTIONS, values)
    if error:
        _fail(error)
    launch: LaunchConfig = build_config(LaunchConfig, LAUNCH_OPTIONS, values)
    if launch.nnodes > 1 and not launch.rdzv_endpoint:
        _fail("--nnodes > 1 needs --rdzv-endpoint host:port")
    config = _trainer_config(values, launch, TrainingSettings())
    try:
        config.validate()
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(config.to_json())
    try:
        code = subprocess.call(launch.torchrun_command(handle.name))
    finally:
        Path(handle.name).unlink(missing_ok=True)
    if code != 0:
        typer.echo(f"error: training failed (torchrun exit status {code})", err=True)
        raise typer.Exit(1)


def _trainer_config(
    values: dict[str, Any], launch: LaunchConfig, settings: TrainingSettings
) -> TrainerConfig:
    """The flags' config, sized to the launch; unset paths and ports fall back to env."""
    config: TrainerConfig = build_config(TrainerConfig, TRAINER_OPTIONS, values)
    metrics_port = config.metrics_port
    return dataclasses.replace(
        config,
        parallel=dataclasses.replace(config.parallel, world_size=launch.world_size),
        checkpoint_dir=config.checkpoint_dir or settings.train_checkpoint_dir,
        metrics_port=settings.trainer_metrics_port if metrics_port is None else metrics_port,
    )


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


train = typer_command(
    [*TRAINER_OPTIONS[:1], *LAUNCH_OPTIONS, *TRAINER_OPTIONS[1:]],
    _train,
    """Train the model with Muon on (dense HSDP, expert, CP) meshes under torchrun.

    Resumes from the newest checkpoint in --checkpoint-dir; prints loss, tokens/s and
    optimizer step time per step.
    """,
)


def _plan(values: dict[str, Any]) -> None:
    error = check_choices(PLAN_OPTIONS, values)
    if error:
        _fail(error)
    try:
        typer.echo(report(build_config(PlanConfig, PLAN_OPTIONS, values)))
    except PlanError as exc:
        _fail(str(exc))


plan = typer_command(
    PLAN_OPTIONS,
    _plan,
    """Predict memory, Newton-Schulz work, all-to-all bytes and the Muon step per GPU.

    For a preset (deepseek-v3, kimi-k2) or an HF config on a cluster, for the trainer's
    dual mesh and for a single shared mesh; throughputs from training/plan/calibration.yaml.
    """,
)
