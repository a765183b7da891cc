"""Read the Iceberg sink's table as its users do: pyiceberg (the catalog, then a scan) and
DuckDB over the table's current snapshot, counting rows by record id."""

from __future__ import annotations

from collections import Counter
from typing import Any


def load_table(catalog_uri: str, warehouse: str, table: str) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from offtake.sinks.spark.iceberg import CATALOG_NAME

    return SqlCatalog(CATALOG_NAME, uri=catalog_uri, warehouse=warehouse).load_table(table)


def ids_by_reader(table: Any) -> dict[str, Counter[int]]:
    """Record ids per reader: pyiceberg's Arrow scan and DuckDB's SQL over the same scan."""
    arrow = table.scan().to_arrow()
    con = table.scan().to_duckdb("orders")
    duck = con.execute("SELECT id, count(*) FROM orders GROUP BY id").fetchall()
    return {
        "pyiceberg": Counter(int(i) for i in arrow.column("id").to_pylist()),
        "duckdb": Counter({int(i): int(n) for i, n in duck}),
    }


def batch_summaries(table: Any) -> list[dict[str, str]]:
    """The offtake properties of each snapshot, oldest first."""
    return [
        {k: v for k, v in s.summary.additional_properties.items() if k.startswith("offtake.")}
        for s in table.snapshots()
        if s.summary is not None
    ]
