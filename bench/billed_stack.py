"""What the real-vLLM benchmarks run: the tiny engine (``tiny_engine``) and, in front of it,
`cstack gateway` as production runs it (billing on: an authenticated embedded Valkey, a
migrated ledger, the usage spool), started with an org and a key of a plan whose limits do
not bind (``billed_gateway``)."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from billing.ledger import make_engine, migrate
from serving.process import ManagedProcess, free_port
from serving.tiny import build_tiny_checkpoint
from serving.valkey import start_valkey


@dataclass(frozen=True)
class Gateway:
    url: str
    internal_url: str
    key: str
    #: The admin API's token (``internal_url``), for a benchmark's own orgs and keys.
    admin_token: str


@contextlib.contextmanager
def billed_gateway(tmp: Path, name: str, env: dict[str, str]) -> Iterator[Gateway]:
    """`cstack gateway` with billing on; ``env`` sets its upstreams and any other
    ``CSTACK_`` setting (``name`` keeps this gateway's files apart from others')."""
    ledger = f"sqlite:///{tmp / f'ledger-{name}.db'}"
    migrate(make_engine(ledger))
    valkey = start_valkey()
    admin_token = secrets.token_urlsafe(16)
    port, internal = free_port(), free_port()
    gateway = ManagedProcess(
        "gateway",
        [sys.executable, "-m", "deploy.cli", "gateway", "--log-level", "warning"],
        tmp / f"gateway-{name}.log",
        f"http://127.0.0.1:{port}/readyz",
        {
            "CSTACK_PORT": str(port),
            "CSTACK_INTERNAL_PORT": str(internal),
            "CSTACK_REDIS_URL": str(valkey.connection_url),
            "CSTACK_LEDGER_URL": ledger,
            "CSTACK_ADMIN_TOKEN": admin_token,
            "CSTACK_USAGE_SPOOL_DIR": str(tmp / f"spool-{name}"),
            "CSTACK_SERVING_PROFILE": "cpu",
            **env,
        },
    )
    gateway.start()
    try:
        gateway.wait_healthy(timeout_s=120)
        admin = {"authorization": f"Bearer {admin_token}"}
        internal_url = f"http://127.0.0.1:{internal}"
        httpx.post(
            f"{internal_url}/admin/orgs",
            json={"org_id": "bench", "plan": "enterprise"},
            headers=admin,
        ).raise_for_status()
        key = httpx.post(f"{internal_url}/admin/orgs/bench/keys", headers=admin).json()["key"]
        yield Gateway(f"http://127.0.0.1:{port}", internal_url, key, admin_token)
    finally:
        gateway.stop()
        valkey.stop()


@contextlib.contextmanager
def tiny_engine(tmp: Path, engine_url: str | None = None) -> Iterator[tuple[str, str]]:
    """``(url, api key)`` of a vLLM engine serving the seed-0 tiny checkpoint with the
    ``shared`` variant (cpu profile): ``engine_url``'s, without a key, if given."""
    if engine_url is not None:
        yield engine_url, ""
        return
    model = build_tiny_checkpoint(tmp / "tiny", seed=0)
    engine_key = secrets.token_urlsafe(24)
    port = free_port()
    engine = ManagedProcess(
        "cstack serve",
        [sys.executable, "-m", "deploy.cli", "serve", "--variant", "shared",
         "--model", str(model), "--port", str(port)],
        tmp / "vllm.log",
        f"http://127.0.0.1:{port}/health",
        {"CSTACK_VLLM_API_KEY": engine_key, "CSTACK_SERVING_PROFILE": "cpu"},
    )  # fmt: skip
    engine.start()
    try:
        engine.wait_healthy(timeout_s=900)
        yield f"http://127.0.0.1:{port}", engine_key
    finally:
        engine.stop()
