"""Run the real gateway app with the real billing Meter, configured from CSTACK_* env.

    python metered_gateway.py

(`cstack gateway` serves with billing switched off until the lead wires ``create_meter``
in; this is the same app with ``billing.meter.create_meter()`` and the webhook router.)
"""

from __future__ import annotations

import faulthandler
import signal

import uvicorn

from billing.http import router
from billing.meter import create_meter
from gateway import GatewaySettings, create_app


def main() -> None:
    # A test that sees a hung shutdown sends SIGUSR1 to get every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = GatewaySettings()
    app = create_app(settings, create_meter(redis_url=settings.redis_url))
    app.include_router(router)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
