"""Settings for the gateway (env prefix ``CSTACK_``); `cstack gateway` flags override them.

Upstreams (the vLLM servers behind each tier) come from three variables:

- ``CSTACK_UPSTREAM_URL``: one base URL (``http://host:port``) used for *both* tiers when
  the tier-specific lists are empty. This is the embedded default: one vLLM engine with
  priority scheduling shared by both tiers (`cstack up` sets only this one).
- ``CSTACK_FAST_UPSTREAM_URLS`` / ``CSTACK_STANDARD_UPSTREAM_URLS``: comma-separated base
  URLs, the replicas of each tier's pool (production: separate deployments per tier).

When the two pools share a URL, the gateway sends vLLM's ``priority`` per tier (read from
serving's ``shared`` variant) so the fast tier is scheduled first; with separate pools it
sends none. ``CSTACK_SEND_TIER_PRIORITY`` forces this either way.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from gateway.upstream.routing import RoutingPolicy
from serving.settings import CstackSettings

UrlList = Annotated[list[str], NoDecode]


class GatewaySettings(CstackSettings):
    #: The public API: /v1/*, the Stripe webhook, /healthz and /readyz.
    port: int = 8080
    #: /metrics and /admin/ (and the probes) answer only here: a port for Prometheus and
    #: operators that a network policy keeps off the public path.
    internal_port: int = 9464
    #: Bearer token of the /admin/ API. No default: unset means the admin API answers 403.
    admin_token: SecretStr | None = None

    #: Default upstream for both tiers (see the module docstring).
    upstream_url: str = "http://127.0.0.1:8000"
    fast_upstream_urls: UrlList = Field(default_factory=list)
    standard_upstream_urls: UrlList = Field(default_factory=list)
    #: None: send vLLM ``priority`` only when both tiers share an upstream URL.
    send_tier_priority: bool | None = None
    #: vLLM's served model name; empty means the one in serving's variants file.
    served_model_name: str = ""

    connect_timeout_s: float = 2.0
    #: Longest silence allowed between two bytes from an upstream (also non-streaming).
    read_timeout_s: float = 600.0
    max_connections_per_upstream: int = 512
    #: Hold each engine's requests to its batch size and share its slots between the tiers
    #: as serving/variants.yaml's ``admission`` says (gateway/upstream/slot_policy.py).
    #: Off only for benchmarks of the relay itself against a stub upstream.
    engine_admission: bool = True
    #: How a pool of several replicas picks one: ``prefix`` (to the replica holding the
    #: request's prompt prefix in its cache, balanced against load: gateway/upstream/routing.py),
    #: ``least_outstanding`` or ``round_robin``.
    routing: RoutingPolicy = "prefix"
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0

    #: The longest a request may run, from its arrival to its last byte, streaming or not.
    #: Then a stream ends with an error event and a non-streaming request gets a 504; what
    #: was generated is billed. Billing renews a request's reservation until then.
    max_request_duration_s: float = Field(1800.0, gt=0)

    max_body_bytes: int = 4 * 1024 * 1024
    #: The request line and headers together, in bytes and in header fields (else 431).
    max_header_bytes: int = Field(default=32 * 1024, ge=1024)
    max_headers: int = Field(100, ge=8)
    #: A request's head must arrive within this long (of the connection's first byte or
    #: the previous response), its body within ``body_timeout_s`` of the head; slower
    #: clients are disconnected.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    #: A client that takes none of what the gateway sends it for this long, while its
    #: writes wait or its connection closes, is cut off: the connection is dropped and its
    #: request ends as a hang-up, billed for what was generated (gateway/server/http11.py
    #: says how taking is counted, and its bounds).
    send_timeout_s: float = Field(60.0, gt=0)
    max_messages: int = 1024
    max_n: int = 16
    #: Prompts in one /v1/completions request (each one runs ``n`` sequences).
    max_prompts: int = Field(64, ge=1)
    #: Per-tier output caps; an unset ``max_tokens`` is sent as the cap (vLLM clamps it to
    #: the context left), a larger one is refused with 400.
    fast_max_tokens: int = 8192
    standard_max_tokens: int = 32768

    #: How long a verified key stays in the in-process cache.
    key_cache_ttl_s: float = 30.0
    #: How often each replica polls the revocation epoch in Redis.
    revocation_poll_s: float = 0.2
    #: Cached keys are trusted only while the last epoch poll is younger than this; the
    #: issue's contract is that a revocation reaches every replica within 1 s.
    revocation_staleness_s: float = 0.8
    #: While Redis does not answer, keys this replica verified keep working for this long
    #: after the last epoch poll that succeeded: also how long a revocation may take to
    #: reach every replica during an outage (0: fail closed at once).
    key_outage_grace_s: float = Field(15.0, ge=0)
    #: Plan of an org created without one.
    default_plan: str = "default"

    log_level: str = "info"
    #: Processes serving this gateway (CSTACK_GATEWAY_WORKERS, `--workers`): one event loop
    #: uses one core at most, so N workers use N (gateway/server/supervisor.py). Default 1: the CPU
    #: count a process sees ignores its container's CPU limit, so the chart sets it from
    #: the pod's CPU instead.
    gateway_workers: int = Field(default=1, ge=1, le=256)
    #: On SIGTERM, requests in flight get this long to finish; then they are cancelled
    #: (each still settles its usage) and the process exits. Below Kubernetes' default
    #: 30 s termination grace, so the pod is never SIGKILLed with usage unsettled.
    shutdown_grace_s: int = Field(20, ge=0)
    #: Meter usage and enforce limits through ``billing`` (CSTACK_BILLING). Off only for a
    #: gateway that must not bill: benchmarks and tests of the relay itself.
    billing: bool = True
    #: Send a request upstream while its admission is still on its way, for keys clear of
    #: every limit (CSTACK_OVERLAP_ADMISSION; gateway/api/admission.py): saves each such
    #: request billing's Redis round trip. Off: every request waits for its admission.
    overlap_admission: bool = True
    #: vLLM's API key (its VLLM_API_KEY), sent as ``Authorization: Bearer`` on every
    #: request to an upstream, health checks included. Unset: none is sent.
    upstream_api_key: SecretStr | None = None

    @model_validator(mode="after")
    def _distinct_ports(self) -> GatewaySettings:
        if self.internal_port == self.port:
            raise ValueError(f"internal_port must differ from port ({self.port})")
        return self

    @field_validator("fast_upstream_urls", "standard_upstream_urls", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("upstream_url", "fast_upstream_urls", "standard_upstream_urls")
    @classmethod
    def _http_origins(cls, value: str | list[str]) -> str | list[str]:
        for url in [value] if isinstance(value, str) else value:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"{url!r} is not an http://host[:port] upstream (no path)")
        return value

    def upstreams_for(self, tier: str) -> list[str]:
        urls = self.fast_upstream_urls if tier == "fast" else self.standard_upstream_urls
        return [url.rstrip("/") for url in (urls or [self.upstream_url])]

    def max_tokens_for(self, tier: str) -> int:
        return self.fast_max_tokens if tier == "fast" else self.standard_max_tokens
