"""Gateway: the OpenAI-compatible front door (tiers, keys, upstream pools, metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.keys import ApiKey, KeyStore, KeyStoreError, Org
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.app import create_app

__all__ = ["ApiKey", "GatewaySettings", "KeyStore", "KeyStoreError", "Org", "create_app"]


def __getattr__(name: str) -> Any:
    # FastAPI loads lazily so that `cstack --help` (which imports gateway.cli) stays fast.
    if name == "create_app":
        from gateway.app import create_app

        return create_app
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
