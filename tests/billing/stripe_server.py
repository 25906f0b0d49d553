"""A local stand-in for the Stripe endpoints billing uses, run as its own process.

Speaks ``POST /v1/billing/meter_events`` the way Stripe does for what we rely on: form
encoded parameters, bearer auth, idempotency keys (a repeated key replays the first
response), and identifiers unique per meter event. Every request is appended to a JSON
lines record so tests can check exactly what arrived. ``--fail-first N`` answers the first
N meter-event requests with a 500, to exercise retries.

    python stripe_server.py --port 12111 --record requests.jsonl [--fail-first 3]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl


class StripeState:
    def __init__(self, record: Path, fail_first: int) -> None:
        self.record = record
        self.fail_left = fail_first
        self.by_key: dict[str, tuple[int, dict[str, Any]]] = {}
        self.identifiers: set[str] = set()
        self.lock = threading.Lock()

    def log(self, entry: dict[str, Any]) -> None:
        with self.record.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")


def _form(body: bytes) -> dict[str, str]:
    return dict(parse_qsl(body.decode(), keep_blank_values=True))


def make_handler(state: StripeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict[str, Any], replayed: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", f"req_{time.monotonic_ns()}")
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/billing/meter_events":
                self._reply(
                    404, {"error": {"type": "invalid_request_error", "message": "no such path"}}
                )
                return
            if not (self.headers.get("Authorization") or "").startswith("Bearer sk_test_"):
                self._reply(401, {"error": {"type": "invalid_request_error", "message": "bad key"}})
                return
            form = _form(body)
            key = self.headers.get("Idempotency-Key") or ""
            entry = {
                "idempotency_key": key,
                "event_name": form.get("event_name"),
                "identifier": form.get("identifier"),
                "timestamp": int(form.get("timestamp") or 0),
                "customer": form.get("payload[stripe_customer_id]"),
                "value": form.get("payload[value]"),
            }
            with state.lock:
                if state.fail_left > 0:
                    state.fail_left -= 1
                    state.log({**entry, "result": "failed"})
                    self._reply(
                        500, {"error": {"type": "api_error", "message": "injected failure"}}
                    )
                    return
                if key and key in state.by_key:
                    status, response = state.by_key[key]
                    state.log({**entry, "result": "replayed"})
                    self._reply(status, response, replayed=True)
                    return
                if entry["identifier"] in state.identifiers:
                    state.log({**entry, "result": "duplicate"})
                    status, response = (
                        400,
                        {
                            "error": {
                                "type": "invalid_request_error",
                                "message": "duplicate identifier",
                            }
                        },
                    )
                else:
                    state.identifiers.add(str(entry["identifier"]))
                    state.log({**entry, "result": "accepted"})
                    status, response = (
                        200,
                        {
                            "object": "billing.meter_event",
                            "event_name": entry["event_name"],
                            "identifier": entry["identifier"],
                            "payload": {
                                "stripe_customer_id": entry["customer"],
                                "value": entry["value"],
                            },
                            "timestamp": entry["timestamp"],
                            "created": int(time.time()),
                            "livemode": False,
                        },
                    )
                if key:
                    state.by_key[key] = (status, response)
            self._reply(status, response)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    state = StripeState(args.record, args.fail_first)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(state))
    server.serve_forever()


if __name__ == "__main__":
    main()
