"""Iceberg tables: Spark writes each batch's Parquet files, one Iceberg commit adds them.

The commit (a snapshot) carries the batch's identity in its summary, as Kafka Connect's
Iceberg sink carries its offsets: ``offtake.topic``, ``offtake.partition`` and
``offtake.offsets`` (``start-end``, inclusive). Before a batch is written the table is asked
how far it already holds the partition (the newest snapshot of the partition in the current
snapshot's ancestry); records up to there are dropped from the batch, so a batch written again
after a crash (written and committed to Iceberg, not yet to Kafka) lands no second time, even
when the restart cuts it at other offsets. The sink commits the offsets to Kafka after the
Iceberg commit, so a crash in between is exactly that case.

The catalog is Iceberg's SQL (JDBC) catalog through pyiceberg: its tables in PostgreSQL (or
SQLite for a single machine) are the ones Iceberg's ``JdbcCatalog`` uses, so Spark, Trino or
Flink with a JDBC catalog open the same tables. The commit is made by pyiceberg in the worker
rather than by iceberg-spark-runtime in Spark: the newest runtime on Maven Central is built for
Spark 4.1 and fails on Spark 4.2+ (``SparkView can not implement ... View``). Spark still
writes the data files (on its executors when the session is a cluster's); the worker reads
their footers for the manifest, so it must reach the warehouse path, as a file sink's worker
must reach its path.

Files a crashed attempt staged are in the table's data folder but in no snapshot: readers
never see them, and Iceberg's orphan file removal deletes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from offtake.config.secret_env import ICEBERG_PASSWORD_ENV, read_secret_env
from offtake.config.spec import IcebergSpec
from offtake.errors import OfftakeError
from offtake.records import TopicPartition
from offtake.redact import redact
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.fileops import join

TOPIC_KEY = "offtake.topic"
PARTITION_KEY = "offtake.partition"
OFFSETS_KEY = "offtake.offsets"
STAGING_PREFIX = "offtake-"
# The catalog name the sink registers its tables under (the catalog_name column of the JDBC
# catalog's tables): readers open the table through a catalog of this name.
CATALOG_NAME = "offtake"


class IcebergError(OfftakeError):
    """The catalog or table could not be used; the message names the field."""


def batch_properties(batch: BatchId) -> dict[str, str]:
    """The snapshot summary properties that identify a batch."""
    return {
        TOPIC_KEY: batch.topic,
        PARTITION_KEY: str(batch.partition),
        OFFSETS_KEY: f"{batch.start}-{batch.end}",
    }


def written_through(summaries: Iterable[dict[str, str]], tp: TopicPartition) -> int | None:
    """The last offset of ``tp`` the table holds, from snapshot summaries newest first."""
    for props in summaries:
        if props.get(TOPIC_KEY) == tp.topic and props.get(PARTITION_KEY) == str(tp.partition):
            offsets = props.get(OFFSETS_KEY, "")
            _, _, end = offsets.partition("-")
            if end.isdigit():
                return int(end)
    return None


def catalog_uri(spec: IcebergSpec) -> str:
    """``catalogUri`` with the password of ``iceberg.passwordSecretRef`` (from the environment
    the operator fills from the Secret), so that the URI in the ConfigMap carries none."""
    if spec.password_secret_ref is None:
        return spec.catalog_uri
    from sqlalchemy.engine import make_url

    password = read_secret_env(ICEBERG_PASSWORD_ENV, "sink.spark.iceberg.passwordSecretRef")
    # render_as_string(hide_password=False): the URL is handed to SQLAlchemy, never logged.
    return make_url(spec.catalog_uri).set(password=password).render_as_string(hide_password=False)


class IcebergTable:
    """The sink's one Iceberg table in a SQL catalog (created from the first batch's files)."""

    def __init__(self, spec: IcebergSpec, warehouse: str) -> None:
        self.spec = spec
        self.warehouse = warehouse.rstrip("/")
        namespace, _, name = spec.table.rpartition(".")
        if not namespace or not name:
            raise IcebergError(f"sink.spark.iceberg.table: {spec.table!r} must be namespace.table")
        self.namespace, self.name = namespace, name
        self._catalog: Any = None

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            try:
                self._catalog = SqlCatalog(
                    CATALOG_NAME, uri=catalog_uri(self.spec), warehouse=self.warehouse
                )
            except Exception as exc:
                raise IcebergError(
                    f"sink.spark.iceberg.catalogUri: cannot open the catalog "
                    f"{redact(self.spec.catalog_uri)}: {redact(str(exc))}"
                ) from exc
        return self._catalog

    def load(self) -> Any | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            return None

    def location(self, table: Any | None) -> str:
        if table is not None:
            return str(table.location()).rstrip("/")
        return join(join(self.warehouse, self.namespace), self.name)

    def create(self, schema: Any) -> Any:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

        catalog = self.catalog()
        with contextlib.suppress(NamespaceAlreadyExistsError):
            catalog.create_namespace(self.namespace)
        try:
            return catalog.create_table(
                self.identifier, schema=schema, location=self.location(None)
            )
        except TableAlreadyExistsError:  # another worker made it first
            return catalog.load_table(self.identifier)

    def written_through(self, table: Any | None, tp: TopicPartition) -> int | None:
        if table is None or table.current_snapshot() is None:
            return None
        from pyiceberg.table.snapshots import ancestors_of

        summaries = (
            dict(s.summary.additional_properties) if s.summary is not None else {}
            for s in ancestors_of(table.current_snapshot(), table.metadata)
        )
        return written_through(summaries, tp)


def schema_of(path: str) -> Any:
    """The Arrow schema of a Parquet file Spark wrote (the table's schema at creation)."""
    import pyarrow.parquet as pq

    return pq.read_schema(path.removeprefix("file:"))
