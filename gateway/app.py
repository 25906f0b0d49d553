"""``create_app(settings, meter)``: the gateway's FastAPI application.

Only the routes listed here exist (no OpenAPI/docs pages, nothing proxied by prefix), so
none of vLLM's own admin or development endpoints can be reached through the gateway.
The app owns the meter it is given: it closes it on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis
from starlette.exceptions import HTTPException as StarletteHTTPException

from billing.meter import Meter
from gateway.admin import build_admin_router
from gateway.auth import Authenticator
from gateway.errors import (
    GatewayError,
    bad_request,
    gateway_error_handler,
    http_exception_handler,
    validation_error_handler,
)
from gateway.generation import CHAT, COMPLETIONS, GenerationHandler
from gateway.keys import KeyStore
from gateway.metrics import GatewayMetrics
from gateway.middleware import RequestContextMiddleware
from gateway.relay import Relay
from gateway.settings import GatewaySettings
from gateway.tiers import PUBLIC_MODELS, TIERS, TierRouter
from gateway.upstream import Upstreams

MODELS_CREATED = 1_767_225_600  # 2026-01-01, the family's launch date


def create_app(settings: GatewaySettings, meter: Meter) -> FastAPI:
    metrics = GatewayMetrics()
    redis = Redis.from_url(settings.redis_url)
    store = KeyStore(redis, settings.default_plan)
    auth = Authenticator(
        store,
        cache_ttl_s=settings.key_cache_ttl_s,
        poll_s=settings.revocation_poll_s,
        staleness_s=settings.revocation_staleness_s,
    )
    upstreams = Upstreams(
        {tier: settings.upstreams_for(tier) for tier in TIERS},
        metrics,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        max_connections=settings.max_connections_per_upstream,
        health_interval_s=settings.health_interval_s,
        health_timeout_s=settings.health_timeout_s,
    )
    generation = GenerationHandler(
        settings,
        auth,
        TierRouter.from_settings(settings),
        meter,
        Relay(upstreams.pools, meter, metrics),
    )
    models_body = {
        "object": "list",
        "data": [
            {"id": model, "object": "model", "created": MODELS_CREATED, "owned_by": "composer"}
            for model in PUBLIC_MODELS
        ],
    }

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await upstreams.start()
        await auth.start()
        try:
            yield
        finally:
            await auth.aclose()
            await upstreams.aclose()
            await meter.aclose()
            await redis.aclose()  # type: ignore[attr-defined]  # stubs predate aclose

    app = FastAPI(
        title="composer-stack gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.upstreams = upstreams
    app.state.key_store = store
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    app.add_exception_handler(GatewayError, gateway_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)

    async def chat_completions(request: Request) -> Response:
        return await generation.handle(request, CHAT)

    async def completions(request: Request) -> Response:
        return await generation.handle(request, COMPLETIONS)

    # The hot routes are plain Starlette routes: the protocol models validate the body
    # themselves, so FastAPI's per-request dependency solving would be pure overhead.
    app.add_route(CHAT.path, chat_completions, methods=["POST"])
    app.add_route(COMPLETIONS.path, completions, methods=["POST"])
    # After the hot routes: Starlette tries routes in order.
    app.include_router(build_admin_router(store, auth))

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        await auth.authenticate(request.headers.get("authorization"))
        return JSONResponse(models_body)

    @app.get("/v1/usage")
    async def usage(request: Request) -> JSONResponse:
        principal = await auth.authenticate(request.headers.get("authorization"))
        start = parse_date(request.query_params.get("start"), "start")
        end = parse_date(request.query_params.get("end"), "end")
        if start and end and start > end:
            raise bad_request("start: must not be after end", param="start")
        return JSONResponse(await meter.usage_summary(principal.key.org_id, start, end))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        pools = {tier: pool.healthy_count for tier, pool in upstreams.pools.items()}
        ready = upstreams.ready()
        return JSONResponse(
            {"status": "ready" if ready else "not_ready", "healthy_upstreams": pools},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def parse_date(value: str | None, param: str) -> date | None:
    if value is None or value == "":
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise bad_request(
            f"{param}: expected a date as YYYY-MM-DD, got {value!r}", param=param
        ) from None
