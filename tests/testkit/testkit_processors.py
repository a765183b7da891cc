"""Processing functions the test-kit tests name by ``module:callable``, as users do."""

from __future__ import annotations

from typing import Any

from offtake.records import Record


def enrich(record: Record) -> Any:
    return {**record.value, "enriched": True}


def poison(record: Record) -> Any:
    if record.value.get("poison"):
        raise ValueError(f"poison record {record.value['id']}")
    return record.value


def fan_out(record: Record) -> Any:
    return [record.value, record.value]


def needs_amount(record: Record) -> Any:
    """Fails like ordinary user code does: a KeyError whose str() is only the key."""
    return {**record.value, "gross": record.value["amount"] * 1.19}
