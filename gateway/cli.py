"""``cstack gateway`` (serve) and ``cstack keys ...`` (manage API keys from the shell)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer

if TYPE_CHECKING:
    from serving.vocabulary import Tier

T = TypeVar("T")


class OnOff(StrEnum):
    on = "on"
    off = "off"


keys_app = typer.Typer(
    help="API keys and an org's settings (tier, Stripe customer): create, revoke, list, "
    "show (talks to Redis, and to the ledger for Stripe customers, directly)."
)


def gateway(
    host: Annotated[str | None, typer.Option(help="Bind address (env CSTACK_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Public API port (env CSTACK_PORT).")] = None,
    internal_port: Annotated[
        int | None,
        typer.Option(help="Port of /metrics and /admin/ (env CSTACK_INTERNAL_PORT)."),
    ] = None,
    upstream_url: Annotated[
        str | None,
        typer.Option(help="vLLM base URL for both tiers (env CSTACK_UPSTREAM_URL)."),
    ] = None,
    fast_upstream_urls: Annotated[
        str | None,
        typer.Option(help="Comma-separated fast-tier replicas (env CSTACK_FAST_UPSTREAM_URLS)."),
    ] = None,
    standard_upstream_urls: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated standard-tier replicas (env CSTACK_STANDARD_UPSTREAM_URLS)."
        ),
    ] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (env CSTACK_REDIS_URL).")] = None,
    log_level: Annotated[str | None, typer.Option(help="Log level (env CSTACK_LOG_LEVEL).")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Processes serving the gateway, one core each (env CSTACK_GATEWAY_WORKERS; "
            "default 1)."
        ),
    ] = None,
) -> None:
    """Run the OpenAI-compatible gateway in front of the vLLM pools."""
    import os

    from gateway.server.supervisor import ListenError, supervise
    from gateway.server.workers import build_app, freeze_and_serve

    if workers is not None and workers < 1:
        _fail(f"--workers must be at least 1 (got {workers})")
    overrides = {
        "host": host,
        "port": port,
        "internal_port": internal_port,
        "upstream_url": upstream_url,
        "fast_upstream_urls": fast_upstream_urls,
        "standard_upstream_urls": standard_upstream_urls,
        "redis_url": redis_url,
        "log_level": log_level,
        "gateway_workers": workers,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    settings = _settings(**given)
    if settings.billing:  # its settings checked here too: one line, not a traceback
        from billing.settings import BillingSettings

        _valid(BillingSettings)
    if settings.gateway_workers == 1:
        freeze_and_serve(build_app(settings), settings)
        return
    # The workers read their settings as this process did: the environment, plus this
    # command line's values in the variables they override.
    env = {**os.environ, **{f"CSTACK_{name.upper()}": str(v) for name, v in given.items()}}
    try:
        code = supervise(settings, env)
    except ListenError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


@keys_app.command("create")
def create_key(
    org: Annotated[str, typer.Option(help="Org id; created if it does not exist.")],
    plan: Annotated[str, typer.Option(help="Billing plan (default: the org's).")] = "",
    name: Annotated[str, typer.Option(help="A label to recognise the key by.")] = "",
) -> None:
    """Create an API key and print it (the only time it is shown)."""

    async def create(store: Any) -> tuple[str, Any]:
        if await store.get_org(org) is None:
            await store.create_org(org, plan=plan)
            typer.echo(f"created org {org}", err=True)
        return await store.create_key(org, plan=plan, name=name)

    token, record = _with_store(create)
    typer.echo(f"key_id: {record.key_id}\norg: {record.org_id}\nplan: {record.plan}")
    typer.echo(f"key: {token}")
    typer.echo("Store the key now: it is not kept and cannot be shown again.", err=True)


@keys_app.command("revoke")
def revoke_key(key_id: Annotated[str, typer.Argument(help="The key's id (not the key).")]) -> None:
    """Revoke a key; every gateway replica refuses it within a second."""
    record = _with_store(lambda store: store.revoke_key(key_id))
    typer.echo(f"revoked {record.key_id} (org {record.org_id})")


@keys_app.command("default-tier")
def default_tier(
    org: Annotated[str, typer.Argument(help="Org id.")],
    tier: Annotated[
        str, typer.Argument(help="fast or standard: the tier of requests without service_tier.")
    ],
) -> None:
    """Set the tier an org's requests get when they name no service_tier (or "auto")."""
    record = _with_store(lambda store: store.update_org(org, default_tier=cast("Tier", tier)))
    typer.echo(f"org {record.org_id}: default tier {record.default_tier}")


@keys_app.command("fast-overflow")
def fast_overflow(
    org: Annotated[str, typer.Argument(help="Org id.")],
    allowed: Annotated[
        OnOff, typer.Argument(help="on: overflow to standard when fast is full; off: wait.")
    ],
) -> None:
    """Let an org's fast requests be served by the standard pool when the fast pool is full
    (answered and billed as standard), or not (they wait for fast, then get a 503)."""
    record = _with_store(lambda store: store.update_org(org, fast_overflow=allowed is OnOff.on))
    state = "on" if record.fast_overflow else "off"
    typer.echo(f"org {record.org_id}: fast overflow to standard {state}")


@keys_app.command("customer")
def customer(
    org: Annotated[str, typer.Argument(help="Org id.")],
    customer_id: Annotated[
        str, typer.Argument(help="Its Stripe customer (cus_...); omit with --remove.")
    ] = "",
    remove: Annotated[
        bool, typer.Option("--remove", help="The org has no Stripe customer from now on.")
    ] = False,
) -> None:
    """Set or change the Stripe customer every invoice item of ORG's months goes to (items
    not yet on a finalized invoice move to it); --remove keeps its usage from Stripe."""
    if bool(customer_id) == remove:
        _fail("give a Stripe customer id or --remove (not both)")

    async def change(store: Any) -> Any:
        if await store.get_org(org) is None:
            raise _store_error(f"unknown org {org!r}")
        # Billing's record first (what invoices go by), then the copy admission reads.
        accounts = _accounts()
        try:
            await accounts.set_customer(org, customer_id or None)
        finally:
            await accounts.aclose()
        return await store.update_org(org, customer_id=customer_id)

    record = _with_store(change)
    typer.echo(f"org {record.org_id}: Stripe customer {record.customer_id or '(none)'}")


@keys_app.command("org")
def show_org(org: Annotated[str, typer.Argument(help="Org id.")]) -> None:
    """Print an org's settings: plan, Stripe customer, default tier, fast overflow."""

    async def read(store: Any) -> Any:
        found = await store.get_org(org)
        if found is None:
            raise _store_error(f"unknown org {org!r}")
        return found

    record = _with_store(read)
    typer.echo(
        f"org: {record.org_id}\nplan: {record.plan}\n"
        f"stripe customer: {record.customer_id or '(none)'}\n"
        f"default tier: {record.default_tier}\n"
        f"fast overflow: {'on' if record.fast_overflow else 'off'}"
    )


@keys_app.command("list")
def list_keys(org: Annotated[str, typer.Option(help="Org id.")]) -> None:
    """List an org's keys (ids and state, never the keys themselves)."""
    records = _with_store(lambda store: store.list_keys(org))
    if not records:
        typer.echo(f"no keys for org {org}", err=True)
    for record in records:
        state = "revoked" if record.revoked_at is not None else "active"
        typer.echo(f"{record.key_id}\t{state}\t{record.plan}\t{record.name}")


def _settings(**overrides: Any) -> Any:
    from gateway.settings import GatewaySettings

    return _valid(GatewaySettings, **overrides)


def _valid(settings_class: Callable[..., T], **overrides: Any) -> T:
    """The settings, or the command ended with the first thing wrong with them."""
    from pydantic import ValidationError

    try:
        return settings_class(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        _fail(f"invalid setting{' ' + where if where else ''}: {first['msg']}")


def _store_error(message: str) -> Exception:
    from gateway.access.keys import KeyStoreError

    return KeyStoreError(message)


def _accounts() -> Any:
    """Where orgs' Stripe customers are recorded: the ledger, unless billing is off."""
    from billing.contract import UnbilledAccounts, create_accounts
    from billing.settings import BillingSettings

    if not _settings().billing:
        return UnbilledAccounts()
    return create_accounts(_valid(BillingSettings))


def _with_store(action: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``action`` on the key store; what the store refuses (an unknown org, a bad
    id...), an unreachable Redis or ledger ends the command with a one-line error."""
    from billing.contract import REDIS_FAILURES, AccountsUnavailable, RedisUrlError, async_client
    from gateway.access.keys import KeyStore, KeyStoreError

    settings = _settings()

    async def run() -> T:
        redis = async_client(settings.redis_url)
        try:
            return await action(KeyStore(redis, settings.default_plan))
        finally:
            await redis.aclose()  # type: ignore[attr-defined]  # stubs predate aclose

    try:
        return asyncio.run(run())
    except (KeyStoreError, RedisUrlError, AccountsUnavailable, ValueError) as exc:
        _fail(str(exc))
    except REDIS_FAILURES as exc:
        _fail(f"cannot reach Redis at CSTACK_REDIS_URL ({type(exc).__name__}: {exc})")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)
