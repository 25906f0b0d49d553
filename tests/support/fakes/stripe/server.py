"""A local stand-in for the Stripe endpoints billing uses, run as its own process.

It speaks Stripe's API v1 (form-encoded, bearer auth) for what billing relies on; what
those endpoints do is ``state.py``:

- ``POST /v1/invoiceitems``, ``GET|POST|DELETE /v1/invoiceitems/{id}``, and
  ``GET /v1/invoiceitems?customer=&pending=&limit=&starting_after=`` (newest first,
  ``limit`` at most 100, ``has_more`` pagination);
- ``POST /v1/invoices`` (a draft), ``GET /v1/invoices/{id}``,
  ``POST /v1/invoices/{id}/finalize`` and ``POST /v1/invoices/create_preview``.

Idempotency keys work as Stripe's do on every POST and DELETE: the first response of a
request that reached the endpoint is saved and replayed (``Idempotent-Replayed: true``)
for the same key, a key reused with other parameters or on another endpoint is refused
with a 400 ``idempotency_error``, and a request refused by validation saves nothing.
Keys never expire here (Stripe prunes them after 24 hours).

Every request is appended to a JSON lines record so tests can check exactly what arrived.
``--fail-first N`` answers the first N invoice-item creations with a 500 before the
endpoint runs (an outage in front of the API: nothing is created, nothing is saved).

    python -m tests.support.fakes.stripe.server --port 12111 --record r.jsonl [--fail-first 3]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.support.fakes.stripe.state import BadRequest, Form, Reply, StripeState, nested

Endpoint = Callable[[StripeState, Form, str], Reply]
ITEM = re.compile(r"^/v1/invoiceitems/(?P<id>ii_[0-9]+)$")
INVOICE = re.compile(r"^/v1/invoices/(?P<id>in_[0-9]+)$")
FINALIZE = re.compile(r"^/v1/invoices/(?P<id>in_[0-9]+)/finalize$")


def route(method: str, path: str) -> Endpoint | None:
    """The endpoint for a request, called with the form and the path's object id."""
    fixed: dict[tuple[str, str], Endpoint] = {
        ("POST", "/v1/invoiceitems"): lambda s, form, _: s.create_item(form),
        ("GET", "/v1/invoiceitems"): lambda s, form, _: s.list_items(dict(form)),
        ("POST", "/v1/invoices/create_preview"): lambda s, form, _: s.preview(form),
        ("POST", "/v1/invoices"): lambda s, form, _: s.create_invoice(form),
    }
    if (method, path) in fixed:
        return fixed[(method, path)]
    by_id: dict[tuple[str, re.Pattern[str]], Endpoint] = {
        ("GET", ITEM): lambda s, _, oid: s.retrieve_item(oid),
        ("POST", ITEM): lambda s, form, oid: s.update_item(oid, form),
        ("DELETE", ITEM): lambda s, _, oid: s.delete_item(oid),
        ("GET", INVOICE): lambda s, _, oid: s.retrieve_invoice(oid),
        ("POST", FINALIZE): lambda s, _, oid: s.finalize_invoice(oid),
    }
    for (verb, pattern), endpoint in by_id.items():
        match = pattern.match(path)
        if verb == method and match:
            return lambda s, form, _: endpoint(s, form, match["id"])
    return None


def make_handler(state: StripeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, reply: Reply, replayed: bool = False) -> None:
            status, body = reply
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

        def _authorized(self) -> bool:
            if (self.headers.get("Authorization") or "").startswith("Bearer sk_test_"):
                return True
            self._reply(
                (401, {"error": {"type": "invalid_request_error", "message": "Invalid API Key"}})
            )
            return False

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if not self._authorized():
                return
            endpoint = route("GET", url.path)
            if endpoint is None:
                self._reply(BadRequest(404, f"Unrecognized request URL (GET: {url.path})").reply)
                return
            form = parse_qsl(url.query, keep_blank_values=True)
            with state.lock:
                try:
                    reply = endpoint(state, form, "")
                except BadRequest as refused:
                    reply = refused.reply
                result = "listed" if url.path == "/v1/invoiceitems" else "read"
                state.log({"method": "GET", "path": url.path, **dict(form), "result": result})
            self._reply(reply)

        def do_POST(self) -> None:
            self._change("POST")

        def do_DELETE(self) -> None:
            self._change("DELETE")

        def _change(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            url = urlsplit(self.path)
            path = url.path
            if not self._authorized():
                return
            endpoint = route(method, path)
            if endpoint is None:
                self._reply(BadRequest(404, f"Unrecognized request URL ({method}: {path})").reply)
                return
            form = parse_qsl(body.decode() or url.query, keep_blank_values=True)
            key = self.headers.get("Idempotency-Key") or ""
            values = dict(form)
            entry = {
                "method": method,
                "path": path,
                "idempotency_key": key,
                "customer": values.get("customer"),
                "amount": values.get("amount"),
                "quantity": values.get("quantity"),
                "unit_amount_decimal": values.get("unit_amount_decimal"),
                "description": values.get("description"),
                "metadata": nested(form, "metadata"),
            }
            fingerprint = (method, path, sorted(form))
            with state.lock:
                if method == "POST" and path == "/v1/invoiceitems" and state.fail_left > 0:
                    state.fail_left -= 1
                    state.log({**entry, "result": "failed"})
                    self._reply((500, {"error": {"type": "api_error", "message": "injected"}}))
                    return
                if key and key in state.by_key:
                    saved_fingerprint, saved = state.by_key[key]
                    if saved_fingerprint != fingerprint:
                        state.log({**entry, "result": "idempotency_error"})
                        message = (
                            "Keys for idempotent requests can only be used with the same "
                            "parameters they were first used with. Try using a key other than "
                            f"'{key}' if you meant to execute a different request."
                        )
                        self._reply(
                            (400, {"error": {"type": "idempotency_error", "message": message}})
                        )
                        return
                    state.log({**entry, "result": "replayed"})
                    self._reply(saved, replayed=True)
                    return
                try:
                    reply = endpoint(state, form, "")
                except BadRequest as refused:
                    state.log({**entry, "result": "invalid"})
                    self._reply(refused.reply)  # validation failed: nothing is saved
                    return
                if key:
                    state.by_key[key] = (fingerprint, reply)
                state.log({**entry, "result": "accepted", "id": reply[1].get("id")})
            self._reply(reply)

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
