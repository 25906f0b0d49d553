"""`cstack billing ...`, `cstack worker billing` and `cstack beat`.

Celery, SQLAlchemy and the price book are imported inside the commands so that
`cstack --help` stays instant.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, NoReturn

import typer

if TYPE_CHECKING:
    from redis import Redis

    from billing.settings import BillingSettings

billing_app = typer.Typer(help="Billing: invoices and the usage ledger.", no_args_is_help=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


@billing_app.command("invoice-preview")
def invoice_preview(
    org: str = typer.Option(..., "--org", help="The organization to preview."),
    period: str = typer.Option(
        "", "--period", help="Billing period as YYYY-MM (default: the current month)."
    ),
) -> None:
    """Print the period's invoice lines for ORG, each rounded to cents once."""
    from sqlalchemy.exc import SQLAlchemyError

    from billing.ledger import make_engine, migrate
    from billing.ledger.invoice import invoice_preview as build_preview
    from billing.prices.periods import current_period
    from billing.prices.pricing import PriceBookError, pricebook_from_path
    from billing.settings import BillingSettings

    settings = BillingSettings()
    try:
        book = pricebook_from_path(settings.pricebook_path)
        engine = make_engine(settings.ledger_url)
        migrate(engine)
        preview = build_preview(engine, book, org, period or current_period())
    except (PriceBookError, ValueError) as exc:
        _fail(str(exc))
    except SQLAlchemyError as exc:
        # The driver's message may contain the URL (with a password): never print it.
        _fail(f"cannot read the ledger ({type(exc).__name__}); check CSTACK_LEDGER_URL")
    typer.echo(preview.render())


@billing_app.command("reconcile")
def reconcile(
    org: str = typer.Option("", "--org", help="The organization to check."),
    all_orgs: bool = typer.Option(
        False,
        "--all",
        help="Every org with usage or items in the period, and each customer's upcoming invoice.",
    ),
    period: str = typer.Option(..., "--period", help="Billing period as YYYY-MM."),
) -> None:
    """Compare what Stripe will invoice for ORG (or --all orgs) in PERIOD with the ledger,
    line by line.

    Exits 0 when they agree to the cent, 1 when they differ (or, with --all, an org with
    no Stripe customer owes something), 2 when they cannot be compared (bad period,
    unknown org, no Stripe customer, Stripe or the ledger unreachable).
    """
    from datetime import UTC, datetime

    import stripe
    from sqlalchemy.exc import SQLAlchemyError

    from billing.ledger import make_engine, migrate
    from billing.prices.periods import period_bounds
    from billing.prices.pricing import PriceBookError, pricebook_from_path
    from billing.settings import BillingSettings
    from billing.stripe.api import stripe_client
    from billing.stripe.reconcile import CannotReconcile
    from billing.stripe.reconcile import reconcile as compare
    from billing.stripe.reconcile_all import reconcile_all
    from billing.stripe.sync import first_open_period

    if bool(org) == all_orgs:
        _fail("give --org ORG or --all (not both)", code=2)
    settings = BillingSettings()
    try:
        period_bounds(period)
        book = pricebook_from_path(settings.pricebook_path)
        client = stripe_client(settings)
        engine = make_engine(settings.ledger_url)
        migrate(engine)
        result = (
            reconcile_all(engine, book, client, period)
            if all_orgs
            else compare(engine, book, client, org, period)
        )
    except (CannotReconcile, PriceBookError, ValueError, RuntimeError) as exc:
        _fail(str(exc), code=2)
    except SQLAlchemyError as exc:
        # The driver's message may contain the URL (with a password): never print it.
        _fail(f"cannot read the ledger ({type(exc).__name__}); check CSTACK_LEDGER_URL", code=2)
    except stripe.StripeError as exc:
        # Only the kind and status: Stripe's messages may quote request details.
        status = f", HTTP {exc.http_status}" if exc.http_status else ""
        _fail(f"cannot read Stripe ({type(exc).__name__}{status})", code=2)
    typer.echo(result.render())
    if not result.agree:
        open_from = first_open_period(datetime.now(UTC), settings)
        if open_from is not None and period >= open_from:
            typer.echo(
                f"note: {period} is posted to Stripe once it has been over for "
                f"{settings.stripe_invoice_grace_s} s (CSTACK_STRIPE_INVOICE_GRACE_S)",
                err=True,
            )
        raise typer.Exit(code=1)


@billing_app.command("migrate")
def migrate_ledger() -> None:
    """Bring the ledger's schema up to date (the worker does this on start too)."""
    from billing.ledger import make_engine, migrate
    from billing.settings import BillingSettings

    migrate(make_engine(BillingSettings().ledger_url))
    typer.echo("ledger schema is up to date")


dead_letters_app = typer.Typer(
    help="Usage events the ledger could not write: list them, replay them once fixed.",
    no_args_is_help=True,
)
billing_app.add_typer(dead_letters_app, name="dead-letters")


def _redis_and_settings() -> tuple[Redis, BillingSettings]:
    from pydantic import ValidationError

    from billing.redis.client import RedisUrlError, sync_client
    from billing.settings import BillingSettings

    try:
        settings = BillingSettings()
    except ValidationError as exc:
        _fail(f"bad billing settings: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    try:
        return sync_client(settings.redis_url), settings
    except RedisUrlError as exc:
        _fail(f"CSTACK_REDIS_URL: {exc}")
    except ValueError:
        _fail("CSTACK_REDIS_URL is not a Redis URL (redis://host:port/db)")


@dead_letters_app.command("list")
def dead_letters_list(
    limit: int = typer.Option(100, min=1, help="Show at most this many, oldest first."),
) -> None:
    """Print each dead letter: its id, the request it bills, and why it was set aside."""
    from billing.ledger.dead_letters import list_dead_letters
    from billing.redis.client import REDIS_FAILURES

    redis, settings = _redis_and_settings()
    try:
        letters = list_dead_letters(redis, settings, limit)
    except REDIS_FAILURES as exc:
        _fail(f"cannot reach Redis at CSTACK_REDIS_URL ({type(exc).__name__})")
    if not letters:
        typer.echo("no dead letters")
    for letter in letters:
        request = letter.request_id or "(not a usage event)"
        reason = " ".join(letter.reason.split())  # one line per letter, greppable
        typer.echo(f"{letter.entry_id}  {request}  {reason}")


@dead_letters_app.command("replay")
def dead_letters_replay(
    entry_ids: list[str] = typer.Argument(
        None, help="Dead-letter ids (from `list`) to replay.", show_default=False
    ),
    replay_all: bool = typer.Option(False, "--all", help="Replay every dead letter."),
) -> None:
    """Put dead letters back on the usage stream for the billing worker to write again.

    Replaying is safe to repeat: the ledger ignores an event id it already holds.
    """
    from billing.ledger.dead_letters import ReplayInterrupted, replay_dead_letters
    from billing.redis.client import REDIS_FAILURES

    if bool(entry_ids) == replay_all:
        _fail("give dead-letter ids or --all (not both)")
    redis, settings = _redis_and_settings()
    try:
        replayed = replay_dead_letters(redis, settings, None if replay_all else entry_ids)
    except ValueError as exc:
        _fail(f"{exc}; nothing was replayed")
    except KeyError as exc:
        _fail(f"no dead letter with id {exc.args[0]}; nothing was replayed")
    except ReplayInterrupted as exc:
        done = ", ".join(exc.replayed) or "none"
        _fail(f"Redis failed part way ({type(exc.cause).__name__}); replayed so far: {done}")
    except REDIS_FAILURES as exc:
        _fail(
            f"cannot reach Redis at CSTACK_REDIS_URL ({type(exc).__name__}); nothing was replayed"
        )
    typer.echo(f"replayed {len(replayed)} dead letter(s) onto the usage stream")


def worker_billing(
    concurrency: int = typer.Option(2, help="Worker threads."),
    loglevel: str = typer.Option("INFO", help="Celery log level."),
) -> None:
    """Run the billing worker: usage stream -> ledger, ledger -> Stripe."""
    from prometheus_client import start_http_server
    from sqlalchemy.exc import SQLAlchemyError

    from billing.redis.client import REDIS_FAILURES
    from billing.worker import celery_app, prepare, settings

    try:
        prepare()
    except REDIS_FAILURES as exc:
        _fail(f"cannot reach Redis at CSTACK_REDIS_URL ({type(exc).__name__})")
    except SQLAlchemyError as exc:
        _fail(f"cannot prepare the ledger ({type(exc).__name__}); check CSTACK_LEDGER_URL")
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    celery_app.worker_main(
        [
            "worker",
            "--queues=billing",
            "--pool=threads",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--hostname=billing-{os.getpid()}@{socket.gethostname()}",
        ]
    )


def beat(loglevel: str = typer.Option("INFO", help="Celery log level.")) -> None:
    """Run Celery beat: schedules stream draining and Stripe sync for the billing worker."""
    from billing.worker import celery_app, settings

    settings.beat_schedule_file.parent.mkdir(parents=True, exist_ok=True)
    celery_app.Beat(loglevel=loglevel).run()
