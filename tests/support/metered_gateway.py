"""Run the real gateway app with billing's real Meter, UsageReader and BillingAccounts,
configured from CSTACK_* env.

    python -m tests.support.metered_gateway   (from the repository root)

(The app `cstack gateway` builds with billing on, plus a stack dump on SIGUSR1 for a test
that sees a hung shutdown.)
"""

from __future__ import annotations

import faulthandler
import signal

from billing.contract import (
    create_accounts,
    create_meter,
    create_usage_reader,
    stripe_webhook_router,
)
from gateway.app import create_app
from gateway.server.listeners import serve
from gateway.settings import GatewaySettings


def main() -> None:
    # A test that sees a hung shutdown sends SIGUSR1 to get every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    settings = GatewaySettings()
    app = create_app(
        settings,
        create_meter(redis_url=settings.redis_url),
        create_usage_reader(),
        accounts=create_accounts(),
    )
    app.include_router(stripe_webhook_router())
    serve(app, settings.model_copy(update={"log_level": "warning"}))


if __name__ == "__main__":
    main()
