"""A local stand-in for the Stripe endpoints billing uses, run as its own process.

``server.py`` speaks the HTTP side, ``state.py`` holds what the endpoints do;
``start_stripe_stand_in`` runs it and returns a ``StripeStandIn`` that reads back every
request it received.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from serving.process import free_port
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[4]


class StripeStandIn:
    """A running stand-in: its base URL, and the record of what it answered."""

    def __init__(self, port: int, record: Path, process: subprocess.Popen[bytes]) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.record = record
        self.process = process

    def requests(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def accepted(self, path: str = "/v1/invoiceitems") -> list[dict[str, Any]]:
        """Requests to ``path`` that Stripe executed (not replays, failures or refusals)."""
        return [r for r in self.requests() if r["path"] == path and r["result"] == "accepted"]

    def results(self, path: str = "/v1/invoiceitems") -> list[str]:
        return [r["result"] for r in self.requests() if r["path"] == path]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start_stripe_stand_in(record_dir: Path, fail_first: int = 0) -> StripeStandIn:
    """Start a stand-in recording into ``record_dir``; ``fail_first`` invoice-item
    creations are answered with a 500 before the endpoint runs."""
    port = free_port()
    record = record_dir / f"stripe-{port}.jsonl"
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.support.fakes.stripe.server"),
            *(f"--port={port}", f"--record={record}", f"--fail-first={fail_first}"),
        ],
        cwd=ROOT,
    )
    server = StripeStandIn(port, record, process)
    try:
        wait_until(lambda: _listening(port), "the Stripe stand-in to listen", 10)
    except BaseException:
        server.stop()
        raise
    return server
