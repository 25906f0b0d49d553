"""`cstack model ...` and `cstack serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

model_app = typer.Typer(help="Build and inspect model checkpoints.", no_args_is_help=True)

VARIANTS = ("standard", "fast", "shared")


@model_app.command("build-tiny")
def build_tiny(
    out: Annotated[Path, typer.Option(help="Directory to write the checkpoint to (replaced).")],
    seed: Annotated[int, typer.Option(help="Seed for the random weights.")] = 0,
    architecture: Annotated[
        str,
        typer.Option(
            help="deepseek_v3 (composer-2.5's) or qwen3_moe (non-MLA: prefix caching on CPU)."
        ),
    ] = "deepseek_v3",
) -> None:
    """Build a tiny random checkpoint (HF format) used in dev, tests and CI.

    Same seed, same bytes. Nothing is downloaded.
    """
    from serving.tiny import build_tiny_checkpoint

    try:
        path = build_tiny_checkpoint(out, seed=seed, architecture=architecture)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"tiny checkpoint written to {path}")


def serve(
    model: Annotated[Path, typer.Option(help="HF checkpoint directory to serve.")],
    variant: Annotated[
        str, typer.Option(help="Tier variant from the variants file: standard, fast or shared.")
    ] = "shared",
    port: Annotated[int, typer.Option(help="Port for vLLM's OpenAI server.")] = 8100,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    print_args: Annotated[
        bool, typer.Option("--print-args", help="Print the engine arguments and exit.")
    ] = False,
    weight_sync: Annotated[
        bool,
        typer.Option(
            "--weight-sync",
            help="Let the RL trainer push new weights into this engine while it serves "
            "(vLLM's dev endpoints and the weight-reload worker extension, from the variants "
            "file's weight_sync section). Only for engines reachable from the gateway and "
            "trainer alone.",
        ),
    ] = False,
) -> None:
    """Run vLLM's OpenAI server for one variant until SIGTERM or Ctrl-C.

    Waits for /health, writes vLLM's log to a file, and exits non-zero naming the cause
    if vLLM dies while starting.
    """
    from serving.engine import engine_for_variant
    from serving.process import ServerStartError, StopRequested, stop_signals_raise
    from serving.variants import VariantError

    if variant not in VARIANTS:
        raise typer.BadParameter(f"must be one of {', '.join(VARIANTS)}", param_hint="--variant")
    try:
        server = engine_for_variant(variant, model, port, host=host, weight_sync=weight_sync)
    except VariantError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if print_args:
        typer.echo(" ".join(server.command))
        return
    if not (model / "config.json").is_file():
        typer.echo(f"error: {model} is not a model directory (no config.json)", err=True)
        raise typer.Exit(2)

    try:
        with stop_signals_raise():
            server.start()
            typer.echo(f"starting vLLM ({variant}) on {server.base_url}; log: {server.log_path}")
            server.wait_healthy(timeout_s=_settings_timeout())
            typer.echo(f"ready: {server.base_url}/v1")
            assert server.process is not None
            code = server.process.wait()
    except StopRequested as stop:
        raise typer.Exit(stop.exit_code) from None
    except ServerStartError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        server.stop()
    if code != 0:
        typer.echo(f"error: vLLM exited with status {code}: {server.failure_cause()}", err=True)
        raise typer.Exit(1)


def _settings_timeout() -> float:
    from serving.settings import ServingSettings

    return ServingSettings().vllm_start_timeout_s
