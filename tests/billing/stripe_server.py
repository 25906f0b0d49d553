"""A local stand-in for the Stripe endpoints billing uses, run as its own process.

It does what Stripe does for what we rely on (API v1, form-encoded, bearer auth):

- ``POST /v1/invoiceitems`` creates a pending invoice item (customer, amount in cents,
  currency, description, ``metadata[...]``, ``period[start]``/``period[end]``; the period
  defaults to the creation instant, as Stripe's does);
- ``GET /v1/invoiceitems?customer=&pending=&limit=&starting_after=`` lists them newest
  first, ``limit`` at most 100, with ``has_more`` pagination;
- ``POST /v1/invoices/create_preview`` previews the customer's upcoming invoice: its
  pending items and their total (404 ``invoice_upcoming_none`` when it has none);
- ``POST /v1/invoices`` creates a draft invoice that takes the pending items when asked
  (``pending_invoice_items_behavior=include``; Stripe's default is ``exclude``).

Idempotency keys work as Stripe's do on every POST: the first response of a request that
reached the endpoint is saved and replayed (``Idempotent-Replayed: true``) for the same
key, a key reused with other parameters or on another endpoint is refused with a 400
``idempotency_error``, and a request refused by validation saves nothing. Keys never
expire here (Stripe prunes them after 24 hours).

Every request is appended to a JSON lines record so tests can check exactly what arrived.
``--fail-first N`` answers the first N invoice-item creations with a 500 before the
endpoint runs (an outage in front of the API: nothing is created, nothing is saved).

    python stripe_server.py --port 12111 --record requests.jsonl [--fail-first 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Reply = tuple[int, dict[str, Any]]
MAX_LIMIT = 100


class BadRequest(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.reply: Reply = (
            status,
            {"error": {"type": "invalid_request_error", "message": message, "code": code, **extra}},
        )


def _nested(form: list[tuple[str, str]], name: str) -> dict[str, str]:
    """``name[key]=value`` pairs as a dict (stripe-python's encoding of a hash)."""
    prefix = f"{name}["
    return {k[len(prefix) : -1]: v for k, v in form if k.startswith(prefix) and k.endswith("]")}


def _integer(value: str | None, param: str) -> int:
    if value is None:
        raise BadRequest(400, f"Missing required param: {param}.", "parameter_missing", param=param)
    try:
        return int(value)
    except ValueError:
        raise BadRequest(400, f"Invalid integer: {value}", "parameter_invalid_integer") from None


class StripeState:
    def __init__(self, record: Path, fail_first: int) -> None:
        self.record = record
        self.fail_left = fail_first
        #: Idempotency key -> (endpoint and parameters, saved response).
        self.by_key: dict[str, tuple[Any, Reply]] = {}
        self.items: list[dict[str, Any]] = []  # in creation order
        self.invoices: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def log(self, entry: dict[str, Any]) -> None:
        with self.record.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self.ids):08d}"

    # -- endpoints (called with the lock held) ------------------------------------------

    def create_item(self, form: list[tuple[str, str]]) -> Reply:
        values = dict(form)
        customer = values.get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        amount = _integer(values.get("amount"), "amount")
        now = int(time.time())
        period = _nested(form, "period")
        start = _integer(period["start"], "period[start]") if period else now
        end = _integer(period["end"], "period[end]") if period else now
        if end < start:
            raise BadRequest(400, "The period end must be on or after its start.")
        item = {
            "id": self.new_id("ii"),
            "object": "invoiceitem",
            "amount": amount,
            "currency": values.get("currency", "usd"),
            "customer": customer,
            "date": now,
            "description": values.get("description"),
            "discountable": amount >= 0,
            "invoice": None,
            "livemode": False,
            "metadata": _nested(form, "metadata"),
            "period": {"start": start, "end": end},
            "proration": False,
            "quantity": 1,
        }
        self.items.append(item)
        return 200, item

    def list_items(self, query: dict[str, str]) -> Reply:
        limit = _integer(query.get("limit", "10"), "limit")
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(400, f"limit must be between 1 and {MAX_LIMIT}.")
        # Newest first, as Stripe lists.
        matching = [
            item
            for item in reversed(self.items)
            if item["customer"] == query.get("customer", item["customer"])
            and (
                "pending" not in query or (item["invoice"] is None) == (query["pending"] == "true")
            )
        ]
        if "starting_after" in query:
            ids = [item["id"] for item in matching]
            if query["starting_after"] not in ids:
                raise BadRequest(400, f"No such invoiceitem: '{query['starting_after']}'")
            matching = matching[ids.index(query["starting_after"]) + 1 :]
        page = matching[:limit]
        return 200, {
            "object": "list",
            "url": "/v1/invoiceitems",
            "has_more": len(matching) > limit,
            "data": page,
        }

    def _invoice(self, invoice_id: str | None, customer: str, items: list[Any]) -> dict[str, Any]:
        lines = [
            {
                "id": f"il_{item['id']}",
                "object": "line_item",
                "amount": item["amount"],
                "currency": item["currency"],
                "description": item["description"],
                "metadata": item["metadata"],
                "period": item["period"],
                "parent": {
                    "type": "invoice_item_details",
                    "invoice_item_details": {"invoice_item": item["id"]},
                },
            }
            for item in items
        ]
        total = sum(item["amount"] for item in items)
        return {
            "id": invoice_id,
            "object": "invoice",
            "customer": customer,
            "currency": "usd",
            "status": "draft",
            "livemode": False,
            "created": int(time.time()),
            "lines": {
                "object": "list",
                "url": "/v1/invoices/lines",
                "has_more": False,
                "data": lines,
            },
            "subtotal": total,
            "total": total,
            # A negative total is not refunded: it goes to the customer's credit balance.
            "amount_due": max(total, 0),
            "starting_balance": 0,
        }

    def _pending(self, customer: str) -> list[dict[str, Any]]:
        return [i for i in self.items if i["customer"] == customer and i["invoice"] is None]

    def preview(self, form: list[tuple[str, str]]) -> Reply:
        customer = dict(form).get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        pending = self._pending(customer)
        if not pending:
            raise BadRequest(
                404, f"No upcoming invoices for customer: {customer}", "invoice_upcoming_none"
            )
        return 200, self._invoice(f"upcoming_in_{customer}", customer, pending)

    def create_invoice(self, form: list[tuple[str, str]]) -> Reply:
        values = dict(form)
        customer = values.get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        taken = []
        if values.get("pending_invoice_items_behavior", "exclude") == "include":
            taken = self._pending(customer)
        invoice = self._invoice(self.new_id("in"), customer, taken)
        for item in taken:
            item["invoice"] = invoice["id"]
        self.invoices[invoice["id"]] = invoice
        return 200, invoice


POSTS = {
    "/v1/invoiceitems": StripeState.create_item,
    "/v1/invoices/create_preview": StripeState.preview,
    "/v1/invoices": StripeState.create_invoice,
}


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
            if url.path != "/v1/invoiceitems":
                self._reply(BadRequest(404, f"Unrecognized request URL (GET: {url.path})").reply)
                return
            query = dict(parse_qsl(url.query, keep_blank_values=True))
            with state.lock:
                try:
                    reply = state.list_items(query)
                except BadRequest as refused:
                    reply = refused.reply
                state.log({"method": "GET", "path": url.path, **query, "result": "listed"})
            self._reply(reply)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = urlsplit(self.path).path
            if not self._authorized():
                return
            endpoint = POSTS.get(path)
            if endpoint is None:
                self._reply(BadRequest(404, f"Unrecognized request URL (POST: {path})").reply)
                return
            form = parse_qsl(body.decode(), keep_blank_values=True)
            key = self.headers.get("Idempotency-Key") or ""
            values = dict(form)
            entry = {
                "method": "POST",
                "path": path,
                "idempotency_key": key,
                "customer": values.get("customer"),
                "amount": values.get("amount"),
                "metadata": _nested(form, "metadata"),
            }
            fingerprint = (path, sorted(form))
            with state.lock:
                if path == "/v1/invoiceitems" and state.fail_left > 0:
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
                    reply = endpoint(state, form)
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
