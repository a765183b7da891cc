"""The example pipeline's processing function: enrich an order event.

A processing function takes one :class:`offtake.records.Record` and returns the value to send
on (same key), ``None`` to drop the record, or a list of values to send several.
"""

from __future__ import annotations

from typing import Any

from offtake import Record

VAT = {"DE": 0.19, "FR": 0.20, "NL": 0.21}


def handle(record: Record) -> dict[str, Any] | None:
    order = record.value
    if not isinstance(order, dict):
        raise TypeError(f"expected a JSON object, got {type(order).__name__}")
    if order.get("status") == "test":
        return None  # test orders are dropped, and still committed
    amount = float(order["amount"])
    rate = VAT.get(order.get("country", ""), 0.0)
    return {**order, "vat": round(amount * rate, 2), "gross": round(amount * (1 + rate), 2)}
