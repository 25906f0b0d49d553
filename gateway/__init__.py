"""Gateway: the OpenAI-compatible front door (tiers, keys, upstream pools, metrics).

The app is ``gateway.app.create_app``; it is not re-exported here because FastAPI would
then load with every ``gateway`` import, `cstack --help` (gateway.cli) included.
"""

from gateway.access.keys import ApiKey, KeyStore, KeyStoreError, Org
from gateway.settings import GatewaySettings

__all__ = ["ApiKey", "GatewaySettings", "KeyStore", "KeyStoreError", "Org"]
