"""Gateway: the OpenAI-compatible front door (tiers, keys, upstream pools, metrics)."""

from gateway.app import create_app
from gateway.keys import ApiKey, KeyStore, KeyStoreError, Org
from gateway.settings import GatewaySettings

__all__ = ["ApiKey", "GatewaySettings", "KeyStore", "KeyStoreError", "Org", "create_app"]
