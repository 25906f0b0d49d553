"""What the Stripe stand-in (``server.py``) holds and does: invoice items and invoices,
as Stripe's API (version 2026-10-28) has them for the calls billing makes.

- An invoice item is pending until an invoice takes it. It has an ``amount`` in cents, or
  a ``quantity`` with a ``unit_amount_decimal`` (cents, at most 12 decimal places) whose
  product is its amount; only one of ``amount`` and ``unit_amount_decimal`` may be given.
  It is listed newest first, and deleted only while pending or on a draft invoice.
- An update (``POST /v1/invoiceitems/{id}``) changes its amount, quantity, unit amount,
  description or metadata, only while it is pending or its invoice is a draft; an
  invoice that is not a draft refuses it (and a delete) with a 400.
- ``POST /v1/invoices`` makes a draft that takes the customer's pending items when asked
  (``pending_invoice_items_behavior=include``); its lines and totals follow its items
  until ``POST /v1/invoices/{id}/finalize`` makes it ``open`` (``paid`` when nothing is
  due, as Stripe marks an invoice with no amount due); finalizing a non-draft is a 400.
- ``POST /v1/invoices/create_preview`` previews the customer's upcoming invoice: its
  pending items (404 ``invoice_upcoming_none`` without any).

Stripe does not document how it rounds a fractional cent of quantity x unit amount;
here it is half away from zero. Billing sends a unit amount only where the product is
whole cents, so nothing it does depends on that.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

Reply = tuple[int, dict[str, Any]]
Form = list[tuple[str, str]]
MAX_LIMIT = 100


class BadRequest(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.reply: Reply = (
            status,
            {"error": {"type": "invalid_request_error", "message": message, "code": code, **extra}},
        )


def nested(form: Form, name: str) -> dict[str, str]:
    """``name[key]=value`` pairs as a dict (stripe-python's encoding of a hash)."""
    prefix = f"{name}["
    return {k[len(prefix) : -1]: v for k, v in form if k.startswith(prefix) and k.endswith("]")}


def integer(value: str | None, param: str, *, minimum: int | None = None) -> int:
    if value is None:
        raise BadRequest(400, f"Missing required param: {param}.", "parameter_missing", param=param)
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(400, f"Invalid integer: {value}", "parameter_invalid_integer") from None
    if minimum is not None and number < minimum:
        raise BadRequest(400, f"Invalid non-negative integer: {value}", param=param)
    return number


def unit_amount(value: str) -> Decimal:
    try:
        unit = Decimal(value)
    except InvalidOperation:
        raise BadRequest(400, f"Invalid decimal: {value}", param="unit_amount_decimal") from None
    if not unit.is_finite() or -unit.as_tuple().exponent > 12:  # type: ignore[operator]
        raise BadRequest(400, "unit_amount_decimal accepts at most 12 decimal places.")
    return unit


class StripeState:
    def __init__(self, record: Path, fail_first: int) -> None:
        self.record = record
        self.fail_left = fail_first
        #: Idempotency key -> (endpoint and parameters, saved response).
        self.by_key: dict[str, tuple[Any, Reply]] = {}
        self.items: dict[str, dict[str, Any]] = {}  # in creation order
        self.invoices: dict[str, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.lock = threading.Lock()

    def log(self, entry: dict[str, Any]) -> None:
        with self.record.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self.ids):08d}"

    # -- invoice items ---------------------------------------------------------------

    def _price(self, item: dict[str, Any], form: Form, *, creating: bool) -> None:
        """Set the item's amount from ``amount``, or ``quantity`` x ``unit_amount_decimal``."""
        values = dict(form)
        if "amount" in values and "unit_amount_decimal" in values:
            raise BadRequest(
                400, "You may only specify one of these parameters: amount, unit_amount_decimal."
            )
        if "amount" in values:
            item["amount"] = integer(values["amount"], "amount")
            item["quantity"], item["pricing"] = 1, None
        elif "unit_amount_decimal" in values or "quantity" in values:
            if "unit_amount_decimal" in values:
                unit = unit_amount(values["unit_amount_decimal"])
            elif item.get("pricing"):
                unit = Decimal(item["pricing"]["unit_amount_decimal"])
            else:
                raise BadRequest(400, "quantity needs a unit_amount_decimal.", param="quantity")
            quantity = integer(values.get("quantity", str(item.get("quantity", 1))), "quantity",
                               minimum=0)  # fmt: skip
            item["quantity"] = quantity
            item["pricing"] = {"type": "price_details", "unit_amount_decimal": str(unit)}
            item["amount"] = int((unit * quantity).quantize(Decimal(1), rounding=ROUND_HALF_UP))
        elif creating:
            raise BadRequest(400, "Missing required param: amount.", "parameter_missing")

    def create_item(self, form: Form) -> Reply:
        values = dict(form)
        customer = values.get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        now = int(time.time())
        period = nested(form, "period")
        start = integer(period["start"], "period[start]") if period else now
        end = integer(period["end"], "period[end]") if period else now
        if end < start:
            raise BadRequest(400, "The period end must be on or after its start.")
        item: dict[str, Any] = {
            "id": self.new_id("ii"),
            "object": "invoiceitem",
            "currency": values.get("currency", "usd"),
            "customer": customer,
            "date": now,
            "description": values.get("description"),
            "invoice": None,
            "livemode": False,
            "metadata": nested(form, "metadata"),
            "period": {"start": start, "end": end},
            "proration": False,
        }
        self._price(item, form, creating=True)
        item["discountable"] = item["amount"] >= 0
        self.items[item["id"]] = item
        return 200, item

    def _item(self, item_id: str) -> dict[str, Any]:
        item = self.items.get(item_id)
        if item is None:
            raise BadRequest(404, f"No such invoiceitem: '{item_id}'", "resource_missing")
        return item

    def _changeable(self, item: dict[str, Any], doing: str) -> None:
        invoice = self.invoices.get(item["invoice"]) if item["invoice"] else None
        if invoice is not None and invoice["status"] != "draft":
            raise BadRequest(
                400,
                f"You can't {doing} an invoice item that is on a finalized invoice "
                f"({invoice['id']}, {invoice['status']}).",
            )

    def retrieve_item(self, item_id: str) -> Reply:
        return 200, self._item(item_id)

    def update_item(self, item_id: str, form: Form) -> Reply:
        item = self._item(item_id)
        self._changeable(item, "update")
        self._price(item, form, creating=False)
        values = dict(form)
        if "description" in values:
            item["description"] = values["description"]
        item["metadata"].update(nested(form, "metadata"))
        return 200, item

    def delete_item(self, item_id: str) -> Reply:
        item = self._item(item_id)
        self._changeable(item, "delete")
        del self.items[item_id]
        if item["invoice"]:
            self.invoices[item["invoice"]]["items"].remove(item_id)
        return 200, {"id": item_id, "object": "invoiceitem", "deleted": True}

    def list_items(self, query: dict[str, str]) -> Reply:
        limit = integer(query.get("limit", "10"), "limit")
        if not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(400, f"limit must be between 1 and {MAX_LIMIT}.")
        # Newest first, as Stripe lists.
        matching = [
            item
            for item in reversed(self.items.values())
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

    # -- invoices --------------------------------------------------------------------

    def _view(self, invoice: dict[str, Any]) -> dict[str, Any]:
        """The invoice as the API shows it: its lines are its items as they are now."""
        items = [self.items[item_id] for item_id in invoice["items"]]
        lines = [
            {
                "id": f"il_{item['id']}",
                "object": "line_item",
                "amount": item["amount"],
                "currency": item["currency"],
                "description": item["description"],
                "metadata": item["metadata"],
                "period": item["period"],
                "quantity": item["quantity"],
                "parent": {
                    "type": "invoice_item_details",
                    "invoice_item_details": {"invoice_item": item["id"]},
                },
            }
            for item in items
        ]
        total = sum(item["amount"] for item in items)
        return {
            **{k: v for k, v in invoice.items() if k != "items"},
            "object": "invoice",
            "currency": "usd",
            "livemode": False,
            "lines": {"object": "list", "url": "/v1/invoices/lines", "has_more": False,
                      "data": lines},
            "subtotal": total,
            "total": total,
            # A negative total is not refunded: it goes to the customer's credit balance.
            "amount_due": max(total, 0),
            "starting_balance": 0,
        }  # fmt: skip

    def _pending(self, customer: str) -> list[dict[str, Any]]:
        return [
            item
            for item in self.items.values()
            if item["customer"] == customer and item["invoice"] is None
        ]

    def preview(self, form: Form) -> Reply:
        customer = dict(form).get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        pending = self._pending(customer)
        if not pending:
            raise BadRequest(
                404, f"No upcoming invoices for customer: {customer}", "invoice_upcoming_none"
            )
        upcoming = {
            "id": f"upcoming_in_{customer}",
            "customer": customer,
            "status": "draft",
            "created": int(time.time()),
            "items": [item["id"] for item in pending],
        }
        return 200, self._view(upcoming)

    def create_invoice(self, form: Form) -> Reply:
        values = dict(form)
        customer = values.get("customer")
        if not customer:
            raise BadRequest(400, "Missing required param: customer.", "parameter_missing")
        taken = []
        if values.get("pending_invoice_items_behavior", "exclude") == "include":
            taken = self._pending(customer)
        invoice = {"id": self.new_id("in"), "customer": customer, "status": "draft",
                   "number": None, "created": int(time.time()),
                   "status_transitions": {"finalized_at": None},
                   "items": [item["id"] for item in taken]}  # fmt: skip
        for item in taken:
            item["invoice"] = invoice["id"]
        self.invoices[invoice["id"]] = invoice
        return 200, self._view(invoice)

    def _invoice(self, invoice_id: str) -> dict[str, Any]:
        invoice = self.invoices.get(invoice_id)
        if invoice is None:
            raise BadRequest(404, f"No such invoice: '{invoice_id}'", "resource_missing")
        return invoice

    def retrieve_invoice(self, invoice_id: str) -> Reply:
        return 200, self._view(self._invoice(invoice_id))

    def finalize_invoice(self, invoice_id: str) -> Reply:
        invoice = self._invoice(invoice_id)
        if invoice["status"] != "draft":
            raise BadRequest(
                400,
                "This invoice is already finalized, you can't re-finalize a non-draft invoice.",
                "invoice_not_editable",
            )
        view = self._view(invoice)
        invoice["status"] = "open" if view["amount_due"] > 0 else "paid"
        invoice["number"] = f"CSTACK-{invoice_id[3:]}"
        invoice["status_transitions"] = {"finalized_at": int(time.time())}
        return 200, self._view(invoice)
