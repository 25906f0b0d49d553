"""`cstack up`: bring the whole platform up locally and keep it up until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer

from deploy.progress import Progress
from deploy.settings import DeploySettings
from deploy.stack import LocalStack


def up(
    demo: Annotated[
        bool,
        typer.Option("--demo", help="After `ready:`, print a completion made with the openai SDK."),
    ] = False,
) -> None:
    """Start embedded Valkey, the shared vLLM engine and the services on top of it.

    Runs `cstack doctor`'s checks first and stops at a failed one. Shows each step while
    it starts (live on a terminal, a line per phase when piped), prints
    `ready: <base url>` once everything is healthy, then runs until Ctrl-C or
    SIGTERM and stops everything it started. Configure with CSTACK_* variables
    (CSTACK_REDIS_URL for an external Redis, CSTACK_MODEL_DIR for another checkpoint,
    CSTACK_GATEWAY_PORT, CSTACK_GATEWAY_INTERNAL_PORT for /metrics and /admin,
    CSTACK_VLLM_PORT, CSTACK_STATE_DIR).

    Valkey's password and vLLM's API key are generated at the first start and kept in
    the state directory (valkey-password, vllm-api-key; mode 0600); `cstack keys` and
    `cstack billing` run from the same directory find the embedded Valkey while it runs.
    """
    from serving.process import ServerStartError, StopRequested, stop_signals_raise
    from serving.vocabulary import TIERS

    if not _checks_pass():
        raise typer.Exit(1)
    progress = Progress()
    stack = LocalStack(DeploySettings(), say=progress.say)
    try:
        with stop_signals_raise() as stop_signals:
            with progress:
                stack.start(progress)
            for tier in TIERS:
                served, text = tier_completion(stack.base_url, stack.dev_key(), tier)
                typer.echo(f"{tier} tier ok (served by {served}): {text!r}")
            typer.echo(f"ready: {stack.base_url}", color=False)
            # The key stays in its file: printed, it would end up in terminal logs.
            typer.echo(
                f"console: {stack.gateway_url}/console (sign in with the dev key: "
                f"cat {stack.dev_key_path})"
            )
            if demo:
                _, text = tier_completion(stack.base_url, stack.dev_key(), "fast")
                typer.echo(f"demo completion: {text!r}")
                typer.echo(
                    f"try: OPENAI_BASE_URL={stack.base_url} OPENAI_API_KEY=$(cat "
                    f"{stack.dev_key_path}) and any OpenAI SDK"
                )
            died = stack.wait(stop_signals)
        typer.echo(f"error: {died.name} exited: {died.failure_cause()}", err=True)
        raise typer.Exit(1)
    except StopRequested:
        pass  # Ctrl-C or SIGTERM: the normal way to stop
    except ServerStartError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        typer.echo("stopping")
        stack.stop()
        typer.echo("stopped")


def _checks_pass() -> bool:
    """`cstack doctor`'s checks for `up`: a line for each that is not ok, one in all if
    every one is. False if a required one failed: better now than inside a step."""
    from deploy.doctor import FAIL, OK, stack_checks

    checks = stack_checks(for_up=True)
    for check in checks:
        if check.status != OK:
            typer.echo(check.line, err=check.status == FAIL)
    if any(check.status == FAIL for check in checks):
        return False
    passed = [check.name for check in checks if check.status == OK]
    typer.echo(f"checks ok: {', '.join(passed)} (`cstack doctor` shows the details)")
    return True


def tier_completion(base_url: str, api_key: str, tier: str) -> tuple[str, str]:
    """One chat completion through the gateway with the openai SDK: (served tier, text)."""
    from openai import OpenAI

    # Closed here, not by the garbage collector later: its finalizer would run inside
    # `cstack up`'s wait and could swallow a stop signal (serving.process.StopSignals).
    with OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=f"composer-2.5-{tier}",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=16,
        )
    reply = raw.parse()
    # Our tier's name; the answer's service_tier holds OpenAI's (priority / default).
    return raw.headers.get("x-cstack-tier", "?"), reply.choices[0].message.content or ""
