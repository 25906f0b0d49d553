"""The `cstack` command: each package contributes its own commands here.

Heavy imports (torch, vLLM) stay inside the commands so that `cstack --help` is instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from deploy.up import up
from serving.cli import model_app, serve

app = typer.Typer(
    name="cstack",
    help="composer-stack: serve and train the composer-2.5 model family.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
worker_app = typer.Typer(help="Run Celery workers.", no_args_is_help=True)

#: Commands an operator runs from a shell against the Redis of a running stack.
_REDIS_SHELL_COMMANDS = {"keys", "billing"}


@app.callback()
def _find_local_redis(ctx: typer.Context) -> None:
    """Without CSTACK_REDIS_URL, `cstack keys` and `cstack billing` use the embedded
    Valkey of the `cstack up` running from this directory (CSTACK_STATE_DIR): its URL
    carries a generated password, which nobody should have to copy into a variable."""
    import os

    if ctx.invoked_subcommand not in _REDIS_SHELL_COMMANDS or "CSTACK_REDIS_URL" in os.environ:
        return
    from deploy.settings import DeploySettings
    from deploy.stack import running_stack_redis_url

    url = running_stack_redis_url(DeploySettings())
    if url is not None:
        os.environ["CSTACK_REDIS_URL"] = url


@app.command("doctor")
def doctor(
    tests: Annotated[
        bool, typer.Option("--tests", help="Also require what `make test` needs (promtool).")
    ] = False,
) -> None:
    """Check what the stack needs before anything starts: Python, free ports, disk,
    Redis and PostgreSQL when configured. One line per check, with what to do about a
    failure; exits 1 if a required one fails."""
    from deploy.doctor import report, stack_checks

    if not report(stack_checks(for_up=False, for_tests=tests), echo=typer.echo):
        raise typer.Exit(1)


app.add_typer(model_app, name="model")
app.command("serve")(serve)
app.command("up")(up)

# --- commands contributed by the other packages (one block each) ---

from billing.cli import beat, billing_app, worker_billing  # noqa: E402

app.add_typer(billing_app, name="billing")
worker_app.command("billing")(worker_billing)
app.command("beat")(beat)

from training.rl.learner.cli import rl  # noqa: E402
from training.rl.rollouts.cli import worker_rollouts  # noqa: E402
from training.rl.tasks.cli import tasks_app, worker_tasks  # noqa: E402

app.add_typer(tasks_app, name="tasks")
app.command("rl")(rl)
worker_app.command("rollouts")(worker_rollouts)
worker_app.command("tasks")(worker_tasks)

from training.cli import plan, train  # noqa: E402

app.command("train")(train)
app.command("plan")(plan)

from gateway.cli import gateway, keys_app  # noqa: E402

app.command("gateway")(gateway)
app.add_typer(keys_app, name="keys")

app.add_typer(worker_app, name="worker")


if __name__ == "__main__":
    app()
