"""The names of a Spark sink table's columns: the Kafka metadata every row carries, and how a
value field whose name would shadow it (or the sink's own ``_offtake_`` columns) is renamed.

A leaf: rows.py writes by these names, schema_columns.py reads a table's columns back by them.
"""

from __future__ import annotations

META_COLUMNS = ("topic", "partition", "offset", "timestamp", "key")
# The prefix of the columns the sink itself adds (writers.py) or stages with.
OWN_PREFIX = "_offtake_"
RENAMED_PREFIX = "value_"


def column_name(field: str) -> str:
    """The column of a value field."""
    # A JSON field must not shadow the Kafka metadata the sink's idempotence and users rely on.
    return f"{RENAMED_PREFIX}{field}" if is_reserved(field) else field


def field_name(column: str) -> str | None:
    """The value field a column holds, None for the metadata and the sink's own columns."""
    if is_reserved(column):
        return None
    field = column.removeprefix(RENAMED_PREFIX)
    return field if column.startswith(RENAMED_PREFIX) and field in META_COLUMNS else column


def is_reserved(name: str) -> bool:
    return name in META_COLUMNS or name.startswith(OWN_PREFIX)
