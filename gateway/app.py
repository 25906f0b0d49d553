"""``create_app(settings, meter, usage, accounts=...)``: the gateway's FastAPI application.

Only the routes listed here exist (no OpenAPI/docs pages, nothing proxied by prefix), so
none of vLLM's own admin or development endpoints can be reached through the gateway.
Billing comes in through its three contracts: ``meter`` on the request path of the
generation routes, ``usage`` for ``GET /v1/usage`` and its receipts only, ``accounts``
for the admin API's Stripe customers. The app owns them: it closes them on shutdown.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp

from billing.contract import (
    AsyncClient,
    BillingAccounts,
    Meter,
    UnbilledAccounts,
    UsageReader,
    async_client,
    connect_early,
)
from gateway.access.admin import build_admin_router
from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore
from gateway.api.endpoints import ChatEndpoint, CompletionsEndpoint
from gateway.api.generation_routes import GenerationRoutes
from gateway.api.handler import GenerationHandler
from gateway.api.relay import Relay
from gateway.api.responses.endpoint import ResponsesEndpoint
from gateway.api.usage_routes import READ_METHODS, add_usage_routes
from gateway.console import add_console_routes
from gateway.errors import (
    GatewayError,
    gateway_error_handler,
    http_exception_handler,
    validation_error_handler,
)
from gateway.metrics import GatewayMetrics
from gateway.server.middleware import ListenerGuard, RequestContextMiddleware
from gateway.settings import GatewaySettings
from gateway.upstream.pools import Upstreams
from gateway.upstream.slot_policy import SlotPolicy, share, slot_policies
from gateway.upstream.tiers import TierRouter
from serving.profile import detect_profile
from serving.settings import ServingSettings
from serving.variants import load_variants
from serving.vocabulary import PUBLIC_MODELS, TIERS

logger = logging.getLogger(__name__)

MODELS_CREATED = 1_767_225_600  # 2026-01-01, the family's launch date

#: The generation endpoints (stateless: one object each serves every request), served by
#: ``GenerationRoutes`` ahead of the app's router.
CHAT = ChatEndpoint()
COMPLETIONS = CompletionsEndpoint()
RESPONSES = ResponsesEndpoint()


def create_app(
    settings: GatewaySettings,
    meter: Meter,
    usage: UsageReader,
    *,
    accounts: BillingAccounts | None = None,
    worker: int = 0,
) -> FastAPI:
    """``accounts``: where the admin API records orgs' Stripe customers (none: billing is
    off). ``worker``: this process's index among ``settings.gateway_workers``
    (gateway/server/workers.py)."""
    accounts = accounts or UnbilledAccounts()
    parts = _build_parts(settings, meter, worker)
    app = GatewayApp(
        title="composer-stack gateway",
        lifespan=_lifespan(parts, meter, usage, accounts),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # Starlette's slash redirect builds its Location from the client's Host header.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.metrics = parts.metrics
    app.state.upstreams = parts.upstreams
    app.state.key_store = parts.store
    # Innermost first (Starlette wraps each one added around the ones before).
    app.add_middleware(
        GenerationRoutes, handler=parts.generation, endpoints=(CHAT, COMPLETIONS, RESPONSES)
    )
    app.add_middleware(ListenerGuard, internal_port=settings.internal_port)
    app.add_middleware(RequestContextMiddleware, metrics=parts.metrics)
    app.add_exception_handler(GatewayError, gateway_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.include_router(build_admin_router(parts.store, parts.auth, accounts))
    _add_account_routes(app, parts.auth, usage)
    _add_operations_routes(app, parts.upstreams, parts.metrics)
    add_console_routes(app, parts.auth, parts.store, usage, accounts, parts.redis)
    return app


class GatewayApp(FastAPI):
    """FastAPI without Starlette's outermost ``ServerErrorMiddleware``: the request context
    (``gateway.server.middleware``) already answers any unhandled error with the gateway's
    JSON 500 and logs it, inside that middleware, so it never saw an error; it only wrapped
    every response message of every request in one more call."""

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        return stack.app if isinstance(stack, ServerErrorMiddleware) else stack


@dataclass(frozen=True)
class _Parts:
    """The objects one gateway process shares between its routes."""

    metrics: GatewayMetrics
    redis: AsyncClient
    store: KeyStore
    auth: Authenticator
    upstreams: Upstreams
    relay: Relay
    generation: GenerationHandler


def _build_parts(settings: GatewaySettings, meter: Meter, worker: int) -> _Parts:
    metrics = GatewayMetrics()
    redis = async_client(settings.redis_url)
    store = KeyStore(redis, settings.default_plan)
    auth = Authenticator(
        store,
        cache_ttl_s=settings.key_cache_ttl_s,
        poll_s=settings.revocation_poll_s,
        staleness_s=settings.revocation_staleness_s,
        outage_grace_s=settings.key_outage_grace_s,
    )
    urls_by_tier = {tier: settings.upstreams_for(tier) for tier in TIERS}
    serving = ServingSettings()
    book = load_variants(serving.variants_file)
    upstreams = Upstreams(
        urls_by_tier,
        metrics,
        slot_policies=worker_slot_policies(
            slot_policies(urls_by_tier, book, detect_profile(serving.serving_profile)),
            worker,
            settings.gateway_workers,
        )
        if settings.engine_admission
        else None,
        max_queue_wait_s={tier: book.slot_sharing.max_queue_wait_s[tier] for tier in TIERS},
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        max_connections=settings.max_connections_per_upstream,
        health_interval_s=settings.health_interval_s,
        health_timeout_s=settings.health_timeout_s,
        api_key=settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None,
        routing=settings.routing,
    )
    relay = Relay(upstreams.pools, meter, metrics)
    generation = GenerationHandler(
        settings, auth, TierRouter.from_settings(settings, book), meter, relay
    )
    return _Parts(metrics, redis, store, auth, upstreams, relay, generation)


def worker_slot_policies(
    policies: dict[str, SlotPolicy], worker: int, workers: int
) -> dict[str, SlotPolicy]:
    """Each engine's slots as one of ``workers`` gateway processes holds them: every process
    keeps its own count, so each gets its share of the batch size (the shares add up to it),
    at least one slot (an engine smaller than the worker count is then over-admitted by
    up to a slot per worker, rather than unreachable from some)."""
    return {
        url: replace(policy, size=max(1, share(policy.size, worker, workers)))
        for url, policy in policies.items()
    }


def _lifespan(
    parts: _Parts, meter: Meter, usage: UsageReader, accounts: BillingAccounts
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as closing:
            # Closed in reverse, each even if another failed to: the meter (what it has
            # gathered to settle) after the requests have ended, and before Redis.
            closing.push_async_callback(parts.redis.aclose)  # type: ignore[attr-defined]
            await connect_early(parts.redis)
            closing.push_async_callback(usage.aclose)
            closing.push_async_callback(accounts.aclose)
            closing.push_async_callback(meter.aclose)
            await parts.upstreams.start()
            closing.push_async_callback(parts.upstreams.aclose)
            await parts.auth.start()
            closing.push_async_callback(parts.auth.aclose)
            yield

    return lifespan


def _add_account_routes(app: FastAPI, auth: Authenticator, usage: UsageReader) -> None:
    """What a key may read about itself: the models it can call, its org's usage and
    receipts (gateway.api.usage_routes)."""
    models_body = {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": MODELS_CREATED, "owned_by": "composer"}
            for model in PUBLIC_MODELS
        ],
    }

    @app.api_route("/v1/models", methods=READ_METHODS)
    async def list_models(request: Request) -> JSONResponse:
        await auth.authenticate(request.headers.get("authorization"))
        return JSONResponse(models_body)

    add_usage_routes(app, auth, usage)


def _add_operations_routes(app: FastAPI, upstreams: Upstreams, metrics: GatewayMetrics) -> None:
    @app.api_route("/healthz", methods=READ_METHODS)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.api_route("/readyz", methods=READ_METHODS)
    async def readyz() -> JSONResponse:
        pools = {tier: pool.healthy_count for tier, pool in upstreams.pools.items()}
        ready = upstreams.ready()
        return JSONResponse(
            {"status": "ready" if ready else "not_ready", "healthy_upstreams": pools},
            status_code=200 if ready else 503,
        )

    @app.api_route("/metrics", methods=READ_METHODS)
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
