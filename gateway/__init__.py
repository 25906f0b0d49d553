"""Gateway: the OpenAI-compatible front door (tiers, keys, upstream pools, metrics), grouped
as ``api`` (the endpoints), ``access`` (keys and auth), ``upstream`` (pools and the relay)
and ``server`` (listeners and processes); README.md is the map.

The app is ``gateway.app.create_app``; it is not re-exported here because FastAPI would
then load with every ``gateway`` import, `cstack --help` (gateway.cli) included.
"""

from gateway.access.keys import ApiKey, KeyStore, KeyStoreError, Org
from gateway.settings import GatewaySettings

__all__ = ["ApiKey", "GatewaySettings", "KeyStore", "KeyStoreError", "Org"]
