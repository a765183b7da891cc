"""Read a file sink's table the way its users do: pandas, pyarrow, DuckDB, Polars and Spark,
each with its default options, given only the sink's path (issue 15).

Each reader's rows are counted by record id and by Kafka (partition, offset), so a test can
say per reader how many rows it saw against the records produced, and which columns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The columns of a row of the tests' JSON records (id, customer, amount) in the documented
# order: the Kafka metadata first, then the value's fields. Nothing else.
META = ["topic", "partition", "offset", "timestamp", "key"]


@dataclass
class Read:
    reader: str
    rows: int
    columns: list[str]
    ids: Counter[int] = field(repr=False)
    positions: Counter[tuple[int, int]] = field(repr=False)

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.ids.values() if n > 1)


def _from_pandas(reader: str, df: Any) -> Read:
    return Read(
        reader,
        len(df),
        [str(c) for c in df.columns],
        Counter(int(i) for i in df["id"]),
        Counter(zip(map(int, df["partition"]), map(int, df["offset"]), strict=True)),
    )


def _from_arrow(reader: str, table: Any) -> Read:
    return _from_pandas(reader, table.to_pandas()) if table.num_rows else _empty(reader, table)


def _empty(reader: str, table: Any) -> Read:
    return Read(reader, 0, list(table.column_names), Counter(), Counter())


def _pandas(path: Path, spark: Any) -> Read:
    import pandas as pd

    return _from_pandas("pandas.read_parquet", pd.read_parquet(path))


def _pyarrow_parquet(path: Path, spark: Any) -> Read:
    import pyarrow.parquet as pq

    return _from_arrow("pyarrow.parquet.read_table", pq.read_table(path))


def _pyarrow_dataset(path: Path, spark: Any) -> Read:
    import pyarrow.dataset as ds

    return _from_arrow("pyarrow.dataset", ds.dataset(path).to_table())


def _duckdb(path: Path, spark: Any) -> Read:
    import duckdb

    # The glob a user writes for a folder of parquet files, partitioned or not.
    with duckdb.connect() as con:
        df = con.sql(f"SELECT * FROM read_parquet('{path}/**/*.parquet')").df()
    return _from_pandas("duckdb read_parquet('<path>/**/*.parquet')", df)


def _polars_read(path: Path, spark: Any) -> Read:
    import polars as pl

    return _from_arrow("polars.read_parquet", pl.read_parquet(path).to_arrow())


def _polars_scan(path: Path, spark: Any) -> Read:
    import polars as pl

    return _from_arrow("polars.scan_parquet", pl.scan_parquet(path).collect().to_arrow())


def _spark(path: Path, spark: Any) -> Read:
    df = spark.read.parquet(str(path))
    rows = df.select("id", "partition", "offset").collect()
    return Read(
        "spark.read.parquet",
        len(rows),
        list(df.columns),
        Counter(int(r["id"]) for r in rows),
        Counter((int(r["partition"]), int(r["offset"])) for r in rows),
    )


READERS: list[Callable[[Path, Any], Read]] = [
    _pandas,
    _pyarrow_parquet,
    _pyarrow_dataset,
    _duckdb,
    _polars_read,
    _polars_scan,
    _spark,
]


def read_everywhere(path: Path, spark: Any) -> list[Read]:
    """The table at ``path`` through every reader, default options, path as given."""
    return [read(path, spark) for read in READERS]


def summary(reads: list[Read]) -> dict[str, int]:
    """Rows per reader, for a test's REPORT line."""
    return {r.reader: r.rows for r in reads}


def json_rows_everywhere(path: Path, spark: Any) -> dict[str, int]:
    """Rows of a json table (JSON lines files) per reader, default options, path as given."""
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    with duckdb.connect() as con:
        rows = con.sql(f"SELECT count(*) FROM read_json('{path}/**/*.json')").fetchall()
    return {
        "duckdb read_json('<path>/**/*.json')": int(rows[0][0]),
        "polars.scan_ndjson('<path>/*.json')": int(
            pl.scan_ndjson(f"{path}/*.json").select(pl.len()).collect().item()
        ),
        'pyarrow.dataset(format="json")': ds.dataset(path, format="json").count_rows(),
        "spark.read.json": int(spark.read.json(str(path)).count()),
    }
