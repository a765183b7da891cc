"""The file sink's layout rules without Spark: data file names carry the batch identity, the
staging folder sits beside the table, and pyarrow's file operations (connect mode) walk and
move as the writer needs. Fast: no JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.fileops import ArrowFileOps
from offtake.sinks.spark.writers import batch_of_file, data_file_name, staging_root


@pytest.mark.parametrize("topic", ["orders", "a.b-c_d", "t-1-2-3", "part-x"])
def test_a_data_file_name_gives_back_its_batch(topic: str) -> None:
    batch = BatchId(topic, 3, 1200, 1299)
    name = data_file_name(batch, 7, "part-00000-0c1d-4e5f-c000.snappy.parquet")
    assert name == f"part-{topic}-3-1200-1299-00007.snappy.parquet"
    assert batch_of_file(name) == batch
    assert batch_of_file(data_file_name(batch, 0, "part-00001-x-c000.json")) == batch


@pytest.mark.parametrize(
    "name",
    [
        "part-00000-0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f-c000.snappy.parquet",  # Spark's own
        "_SUCCESS",
        ".part-orders-0-0-9-00000.snappy.parquet.crc",
        "orders-0-0-9-00000.parquet",
        "part-orders-0-9-00000.parquet",
    ],
)
def test_other_files_are_not_batches(name: str) -> None:
    assert batch_of_file(name) is None


def test_staging_sits_beside_the_table_unless_it_has_no_parent(tmp_path: Path) -> None:
    assert staging_root("s3a://lake/orders") == "s3a://lake/_offtake_staging/orders"
    assert staging_root("s3a://lake/db/orders/") == "s3a://lake/db/_offtake_staging/orders"
    assert staging_root("s3a://lake") == "s3a://lake/_offtake_staging"
    assert staging_root(str(tmp_path / "t")) == str(tmp_path / "_offtake_staging" / "t")
    assert staging_root("/") == "/_offtake_staging"  # a mount point: inside


def test_arrow_file_ops_walk_skips_hidden_and_move_creates_folders(tmp_path: Path) -> None:
    fs = ArrowFileOps()
    table = tmp_path / "t"
    (table / "customer=c1").mkdir(parents=True)
    (table / "_offtake_staging").mkdir()
    (table / "customer=c1" / "part-a").write_text("x")
    (table / "_offtake_staging" / "part-b").write_text("x")
    (table / ".part-a.crc").write_text("x")
    assert fs.walk(str(table)) == ["customer=c1/part-a"]
    src = tmp_path / "staged"
    src.write_text("y")
    fs.move_file(str(src), str(table / "customer=c2" / "part-c"))
    assert (table / "customer=c2" / "part-c").read_text() == "y"
    with pytest.raises(OSError):
        fs.move_file(str(table / "customer=c1" / "part-a"), str(table / "customer=c2" / "part-c"))
    # Deleting a file takes a checksum Hadoop's local filesystem may have left beside it.
    (table / "customer=c1" / ".part-a.crc").write_text("x")
    fs.delete(str(table / "customer=c1" / "part-a"))
    assert sorted(p.name for p in (table / "customer=c1").iterdir()) == []
