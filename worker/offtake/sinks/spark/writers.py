"""Idempotent batch writers: a batch written again replaces its earlier copy.

After a crash between a successful job and the offset commit, the restarted worker reads the
same records again and writes them again, possibly cut into batches at other offsets (the time
bound depends on when the worker restarted). So a write replaces every earlier batch of the
same partition that starts inside its offset range (BatchId.supersedes), not only one of the
same name. Those earlier batches were never committed (otherwise the records would not have
come back), and the records they held that this batch lacks come back in the next batches.

- parquet / json: the table is plain files any reader opens: ``<path>/[<partition
  folders>/]part-<id>-<n>.<ext>``, nothing else, no extra column. The batch identity lives in
  the file names: a write deletes the files of the batches it supersedes, then moves its own
  files (written by Spark to a staging folder beside the table) into place one by one. Each
  file appears whole (a rename, or an object store's copy); a batch as a whole does not, so a
  reader listing the table during a move sees part of that batch. See FileWriter.
- delta: one transaction that overwrites with ``replaceWhere`` on the lineage columns.
- iceberg: Spark writes the batch's Parquet files into the table's data folder, then one
  Iceberg commit adds them, its snapshot summary naming the batch; see iceberg.py.
- jdbc: Spark writes the batch to a staging table; then, in one database transaction, rows
  of superseded batches are deleted and the staged rows inserted. Column names in those
  statements are quoted by the database's rules (identifiers.quote), and records with names
  that cannot be written never get this far (identifiers.NameCheck, in the sink's submit).

Table formats (delta, jdbc) get lineage columns, added after the transform so a transform
cannot lose them: ``_offtake_topic``, ``_offtake_partition``, ``_offtake_start``,
``_offtake_end`` (the batch's inclusive offset range).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from offtake.config.spec import IcebergSpec, SparkSinkSpec
from offtake.errors import OfftakeError
from offtake.records import TopicPartition
from offtake.sinks.spark.batching import BatchId
from offtake.sinks.spark.errors import describe
from offtake.sinks.spark.fileops import ArrowFileOps, FileOps, HadoopFileOps, join, split_parent
from offtake.sinks.spark.iceberg import STAGING_PREFIX, IcebergTable, batch_properties, schema_of
from offtake.sinks.spark.identifiers import (
    SPARK,
    Dialect,
    UnsafeName,
    dialect_of,
    quote,
    table_problem,
)
from offtake.sinks.spark.jdbc import (
    JdbcError,
    JvmStatements,
    PsycopgStatements,
    Statements,
    credentials,
)
from offtake.sinks.spark.session import is_remote

log = logging.getLogger(__name__)

DATA_FILE_PREFIX = "part-"
STAGING_DIR = "_offtake_staging"
# Each row's batch, while several batches share one Spark job (FileWriter.write_batches); it
# names staging folders only, never a column of the table.
BATCH_COLUMN = "_offtake_batch"

StillOwned = Callable[[], bool]


class BatchAbandoned(OfftakeError):
    """The batch's partition was revoked before the swap; nothing was replaced."""


class Writer(ABC):
    """Writes one batch's DataFrame so that writing it again leaves one copy."""

    # True if write_batches works: the sink then runs the queued batches of several
    # partitions as one Spark job.
    combines_batches = False

    @abstractmethod
    def write(self, df: Any, batch: BatchId, still_owned: StillOwned) -> None: ...

    def write_batches(
        self, df: Any, batches: Sequence[BatchId], still_owned: Callable[[BatchId], bool]
    ) -> list[BatchId]:
        """Writers that can write batches of several partitions in one job override this
        (see FileWriter); ``combines_batches`` says whether the sink may call it."""
        raise NotImplementedError

    def written_through(self, tp: TopicPartition) -> int | None:
        """The last offset of ``tp`` the target already holds, for writers that record it
        (Iceberg); the sink then drops records up to there before the job. None: unknown."""
        return None


def with_lineage(df: Any, batch: BatchId) -> Any:
    from pyspark.sql import functions as F

    return (
        df.withColumn("_offtake_topic", F.lit(batch.topic))
        .withColumn("_offtake_partition", F.lit(batch.partition).cast("int"))
        .withColumn("_offtake_start", F.lit(batch.start).cast("long"))
        .withColumn("_offtake_end", F.lit(batch.end).cast("long"))
    )


class FileWriter(Writer):
    """parquet or json under ``path``: each batch's files moved into place under its name.

    See the module docstring for the layout; a batch goes through these steps, each of which
    a crash may interrupt without a record landing twice once the batch is written again:

    1. Spark writes the batch to ``<staging>/<id>.<uuid>`` (outside the table).
    2. Files of batches this one supersedes are deleted from the table.
    3. Each staged data file is moved to ``[partition folders/]part-<id>-<n><ext>``.
    4. The staged folder, and staged folders of superseded batches, are deleted.

    A crash after 2 or inside 3 leaves part of the batch, or none of it, in the table; the
    batch was not committed, so it is written again, and step 2 of that write deletes whatever
    of it (or of an earlier cut of its records) landed.
    """

    combines_batches = True

    def __init__(self, fmt: str, path: str, partition_by: tuple[str, ...], fs: FileOps) -> None:
        self.fmt, self.path, self.partition_by, self.fs = fmt, path.rstrip("/"), partition_by, fs
        self.staging_root = staging_root(self.path)

    def write(self, df: Any, batch: BatchId, still_owned: StillOwned) -> None:
        staged = join(self.staging_root, f"{batch}.{uuid.uuid4().hex}")
        writer = df.write.format(self.fmt).mode("error")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(staged)
        if not still_owned():
            self.fs.delete(staged)
            raise BatchAbandoned(f"batch {batch}: partition revoked before the swap")
        self._swap(batch, staged)
        self.fs.delete(staged)
        self._sweep_staging(batch)

    def write_batches(
        self, df: Any, batches: Sequence[BatchId], still_owned: Callable[[BatchId], bool]
    ) -> list[BatchId]:
        """Write several batches in one Spark job; return those not swapped in because their
        partition was revoked meanwhile. Batches of one partition come in offset order and
        are swapped in that order.

        ``df`` carries ``BATCH_COLUMN``, each row's index into ``batches``. Spark writes it
        partitioned by that column, so each batch's rows land in their own staging folder
        (``<column>=<index>``) and the column itself in no file; then each batch is swapped
        in as ``write`` does. A Spark job costs about a second of fixed work whatever its
        size, so one job for the batches of all partitions instead of one each is most of
        the sink's throughput on a small worker.
        """
        # Named after the first batch, so a crashed attempt's leftovers are swept with it.
        staged = join(self.staging_root, f"{batches[0]}.{uuid.uuid4().hex}")
        writer = df.write.format(self.fmt).mode("error")
        writer = writer.partitionBy(BATCH_COLUMN, *self.partition_by)
        writer.save(staged)
        abandoned: list[BatchId] = []
        # One listing of the table for the whole job (a listing costs a call per file through
        # py4j or an object store): a job's batches have disjoint offset ranges, so no batch
        # supersedes files another batch of the job moves in, and each file is superseded by
        # one batch at most.
        table = self.fs.walk(self.path)
        for n, batch in enumerate(batches):
            if still_owned(batch):
                self._swap(batch, join(staged, f"{BATCH_COLUMN}={n}"), table)
            else:
                log.info("batch %s: partition revoked before the swap", batch)
                abandoned.append(batch)
        self.fs.delete(staged)
        for batch in batches:
            self._sweep_staging(batch)
        return abandoned

    def _swap(self, batch: BatchId, staged: str, table: list[str] | None = None) -> None:
        """Steps 2 and 3 of the class docstring for one batch staged at ``staged``;
        ``table``: the table's files listed before (else listed now)."""
        superseded: dict[BatchId, int] = {}
        for rel in self.fs.walk(self.path) if table is None else table:
            old = batch_of_file(rel.rpartition("/")[2])
            if old is not None and batch.supersedes(old):
                self.fs.delete(join(self.path, rel))
                superseded[old] = superseded.get(old, 0) + 1
        for old, files in sorted(superseded.items()):
            log.info(
                "batch %s replaces earlier uncommitted batch %s (%d file(s))", batch, old, files
            )
        # Spark's own files only: not _SUCCESS, not checksums, nothing it left half-written
        # in a _temporary folder.
        for n, rel in enumerate(self.fs.walk(staged)):
            folder, _, name = rel.rpartition("/")
            target = data_file_name(batch, n, name)
            if folder:  # a partitionBy folder such as customer=c1
                target = join(folder, target)
            self.fs.move_file(join(staged, rel), join(self.path, target))

    def _sweep_staging(self, batch: BatchId) -> None:
        # Staged folders of crashed attempts at superseded batches would otherwise pile up.
        for name in self.fs.list_names(self.staging_root):
            old = _batch_of_staging(name)
            if old is not None and batch.supersedes(old):
                self.fs.delete(join(self.staging_root, name))


def staging_root(path: str) -> str:
    """Where a file sink's batches are written before they move into the table.

    Beside the table, not in it: pyarrow, pandas and Spark skip folders starting with '_',
    but DuckDB's ``**`` glob and Polars' folder reads do not, and would read a batch that is
    still being written (or one a crash left behind). Inside the table only when it has no
    parent to write beside (a bucket root, a mount point); see docs/spark-sink.md.
    """
    split = split_parent(path)
    if split is None:
        return join(path, STAGING_DIR)
    parent, name = split
    return join(join(parent, STAGING_DIR), name)


def data_file_name(batch: BatchId, n: int, spark_name: str) -> str:
    """``part-<topic>-<partition>-<start>-<end>-<n>`` plus the extension of Spark's file
    (``.snappy.parquet``, ``.json``): readers glob on the extension, the sink on the id."""
    ext = spark_name[spark_name.find(".") :] if "." in spark_name else ""
    return f"{DATA_FILE_PREFIX}{batch}-{n:05d}{ext}"


def batch_of_file(name: str) -> BatchId | None:
    """The batch a data file belongs to, from its name; None for any other file (Spark's own
    ``part-00000-<uuid>-c000...`` names do not parse: their last field is not a number)."""
    if not name.startswith(DATA_FILE_PREFIX):
        return None
    head, _, tail = name[len(DATA_FILE_PREFIX) :].rpartition("-")
    if not tail.split(".", 1)[0].isdigit():
        return None
    try:
        return BatchId.parse(head)
    except ValueError:
        return None


def _batch_of_staging(name: str) -> BatchId | None:
    try:
        return BatchId.parse(name.rsplit(".", 1)[0])
    except ValueError:
        return None


def superseded_predicate(batch: BatchId, dialect: Dialect = SPARK) -> tuple[str, list[str | int]]:
    """SQL condition matching rows of the batches ``batch`` supersedes (params as '?')."""

    def q(name: str) -> str:
        return quote(name, dialect)

    sql = (
        f"{q('_offtake_topic')} = ? AND {q('_offtake_partition')} = ? "
        f"AND {q('_offtake_start')} >= ? AND {q('_offtake_start')} <= ?"
    )
    return sql, [batch.topic, batch.partition, batch.start, batch.end]


def _inline(sql: str, params: list[str | int]) -> str:
    """Bind parameters into Spark SQL text (for replaceWhere, which takes no parameters)."""
    for p in params:
        literal = (
            str(p)
            if isinstance(p, int)
            else "'" + p.replace("\\", "\\\\").replace("'", "\\'") + "'"
        )
        sql = sql.replace("?", literal, 1)
    return sql


class DeltaWriter(Writer):
    """delta at ``path``: ``replaceWhere`` over the superseded batches, in one commit."""

    def __init__(self, path: str, partition_by: tuple[str, ...], fs: FileOps) -> None:
        self.path, self.partition_by, self.fs = path.rstrip("/"), partition_by, fs

    def write(self, df: Any, batch: BatchId, still_owned: StillOwned) -> None:
        if not still_owned():
            raise BatchAbandoned(f"batch {batch}: partition revoked before the write")
        df = with_lineage(df, batch)
        writer = df.write.format("delta").option("mergeSchema", "true")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        if self.fs.exists(join(self.path, "_delta_log")):
            cond, params = superseded_predicate(batch)
            writer = writer.mode("overwrite").option("replaceWhere", _inline(cond, params))
        else:
            # A new table: nothing to replace. If another worker creates it first, Delta's
            # conflict check fails this write and the retry takes the replaceWhere path.
            writer = writer.mode("append")
        writer.save(self.path)


# What staging_table() appends to the table's name: "__offtake_" + 6 + "_" + 10 characters.
STAGING_SUFFIX_CHARS = len("__offtake_") + 6 + 1 + 10


def check_jdbc_table(spec: SparkSinkSpec) -> None:
    """ValueError naming ``sink.spark.jdbc.table`` if the sink cannot use it safely."""
    if spec.jdbc is None:
        return
    why = table_problem(spec.jdbc.table, dialect_of("jdbc", spec.jdbc.url), STAGING_SUFFIX_CHARS)
    if why is not None:
        raise ValueError(f"sink.spark.jdbc.table: {why}")


class JdbcWriter(Writer):
    """A database table: staging table, then delete superseded + insert in one transaction."""

    def __init__(self, spec: SparkSinkSpec, statements: Statements) -> None:
        assert spec.jdbc is not None
        check_jdbc_table(spec)
        self.jdbc = spec.jdbc
        self.table = spec.jdbc.table
        self.statements = statements
        self.dialect = dialect_of("jdbc", spec.jdbc.url)
        self._target_ready = False
        self._swept: set[TopicPartition] = set()

    def staging_table(self, batch: BatchId) -> str:
        # Deterministic per batch, so a rewrite reuses (overwrites) a crashed attempt's table,
        # and prefixed per partition, so leftovers of attempts cut differently can be found;
        # short, because databases cap identifier length (PostgreSQL: 63).
        digest = hashlib.sha1(str(batch).encode()).hexdigest()[:10]
        return f"{self._staging_prefix(batch)}{digest}"

    def _staging_prefix(self, batch: BatchId) -> str:
        tp = hashlib.sha1(f"{batch.topic}-{batch.partition}".encode()).hexdigest()[:6]
        return f"{self.table}__offtake_{tp}_"

    def _sweep_leftovers(self, batch: BatchId) -> None:
        """Drop staging tables of this partition left by earlier attempts.

        A crashed worker leaves its batch's staging table; the restart usually cuts the same
        batch and overwrites it, but a batch cut at another end offset has another name. Once
        per partition and writer (leftovers predate this worker's ownership) after a swap:
        whatever else is staged for the partition is either such a leftover or a zombie
        owner's batch, which must not land anyway (its swap then fails, and it commits nothing).
        """
        if batch.tp in self._swept:
            return
        self._swept.add(batch.tp)
        schema = self.table.rpartition(".")[0]
        prefix = self._staging_prefix(batch).rpartition(".")[2]
        try:
            leftovers = self.statements.tables(schema or None, prefix)
        except Exception as exc:
            log.warning("batch %s: could not list staging tables to sweep: %s", batch, exc)
            return
        # The batch's own staging table is gone already (or its drop failed: then try again).
        for table in leftovers:
            # The name as the database listed it, so quoted (exact case); one that is not a
            # plain name is nobody's staging table of ours, whoever made it.
            try:
                quoted = quote(table, self.dialect)
            except UnsafeName:
                log.warning("batch %s: not dropping table %s: not a name of ours", batch, table)
                continue
            qualified = f"{schema}.{quoted}" if schema else quoted
            try:
                self.statements.execute(f"DROP TABLE {qualified}")
                log.info("batch %s: dropped staging table %s of an earlier attempt", batch, table)
            except Exception as exc:
                log.warning("batch %s: could not drop staging table %s: %s", batch, table, exc)

    def _props(self) -> dict[str, str]:
        return credentials(self.jdbc)

    def write(self, df: Any, batch: BatchId, still_owned: StillOwned) -> None:
        df = _flatten_for_jdbc(with_lineage(df, batch))
        stage = self.staging_table(batch)
        props = self._props()
        df.write.jdbc(self.jdbc.url, stage, mode="overwrite", properties=props)
        if not self._target_ready:
            # Creates the table with the batch's schema if it is missing; appends no rows.
            df.limit(0).write.jdbc(self.jdbc.url, self.table, mode="append", properties=props)
            self._target_ready = True
        if not still_owned():
            self.statements.execute(f"DROP TABLE {stage}")
            raise BatchAbandoned(f"batch {batch}: partition revoked before the swap")
        # Quoted by the database's rules; a name that cannot be (a transform's column, a
        # schema's field that no record of this batch carried) fails the batch here, before
        # any statement runs: UnsafeName names the column.
        cols = ", ".join(quote(c, self.dialect) for c in df.columns)
        cond, params = superseded_predicate(batch, self.dialect)
        try:
            deleted, _ = self.statements.transaction(
                [
                    (f"DELETE FROM {self.table} WHERE {cond}", params),
                    (f"INSERT INTO {self.table} ({cols}) SELECT {cols} FROM {stage}", []),
                ]
            )
        except Exception as exc:
            # describe(): the database's own message (the JDBC driver's exception under py4j's
            # "An error occurred while calling ..."), without credentials.
            raise JdbcError(
                f"batch {batch}: swap into {self.table} failed: {describe(exc)}"
            ) from exc
        if deleted:
            log.info("batch %s replaced %d row(s) of earlier uncommitted batches", batch, deleted)
        try:
            self.statements.execute(f"DROP TABLE {stage}")
        except Exception as exc:  # the rows are in; a leftover staging table is only clutter
            log.warning("batch %s: could not drop staging table %s: %s", batch, stage, exc)
        self._sweep_leftovers(batch)


class IcebergWriter(Writer):
    """Writes a batch as one Iceberg commit; see the module docstring."""

    combines_batches = True

    def __init__(self, spec: IcebergSpec, warehouse: str, fs: FileOps) -> None:
        self.table = IcebergTable(spec, warehouse)
        self.fs = fs

    def written_through(self, tp: TopicPartition) -> int | None:
        """The last offset of ``tp`` already committed to the table (None: none)."""
        return self.table.written_through(self.table.load(), tp)

    def write(self, df: Any, batch: BatchId, still_owned: StillOwned) -> None:
        staged = self._staging_folder(batch)
        df.write.format("parquet").mode("error").save(staged)
        if not still_owned():
            self.fs.delete(staged)
            raise BatchAbandoned(f"batch {batch}: partition revoked before the commit")
        self._commit(batch, staged)

    def write_batches(
        self, df: Any, batches: Sequence[BatchId], still_owned: Callable[[BatchId], bool]
    ) -> list[BatchId]:
        """One Spark job writes the batches' files (a staging folder per batch, as in
        FileWriter.write_batches); each batch is then its own Iceberg commit."""
        staged = self._staging_folder(batches[0])
        df.write.format("parquet").mode("error").partitionBy(BATCH_COLUMN).save(staged)
        abandoned: list[BatchId] = []
        for n, batch in enumerate(batches):
            folder = join(staged, f"{BATCH_COLUMN}={n}")
            if still_owned(batch):
                self._commit(batch, folder)
            else:
                log.info("batch %s: partition revoked before the commit", batch)
                self.fs.delete(folder)
                abandoned.append(batch)
        return abandoned

    def _staging_folder(self, batch: BatchId) -> str:
        existing = self.table.load()
        return join(
            join(self.table.location(existing), "data"),
            f"{STAGING_PREFIX}{batch}-{uuid.uuid4().hex[:12]}",
        )

    def _commit(self, batch: BatchId, staged: str) -> None:
        """Add the batch's files under ``staged`` to the table in one commit."""
        files = [join(staged, rel) for rel in self.fs.walk(staged) if rel.endswith(".parquet")]
        if not files:
            self.fs.delete(staged)
            return
        # Loaded again: the table may have moved on while Spark wrote (another worker's commit).
        table = self.table.load() or self.table.create(schema_of(files[0]))
        through = self.table.written_through(table, batch.tp)
        if through is not None and through >= batch.start:
            # Another attempt committed meanwhile (a retry after a commit whose answer was
            # lost): the table has these records; adding them again would duplicate them.
            self.fs.delete(staged)
            log.info("batch %s: already in the table through offset %d", batch, through)
            return
        table.add_files(files, snapshot_properties=batch_properties(batch))
        log.debug("batch %s: %d file(s) committed to %s", batch, len(files), self.table.spec.table)


def _flatten_for_jdbc(df: Any) -> Any:
    """Nested columns as JSON text: JDBC tables have no struct, array or map type."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    for f in df.schema.fields:
        if isinstance(f.dataType, StructType | ArrayType | MapType):
            # A backtick inside a quoted Spark name is written twice.
            df = df.withColumn(f.name, F.to_json(F.col("`" + f.name.replace("`", "``") + "`")))
    return df


def make_writer(spec: SparkSinkSpec, session: Any) -> Writer:
    """The writer for ``spec.format``, using the session's kind to reach files or databases."""
    remote = is_remote(session)
    if spec.format == "iceberg":
        if spec.iceberg is None or not spec.path:
            raise ValueError("sink.spark.iceberg: required (with path) for format iceberg")
        return IcebergWriter(spec.iceberg, spec.path, ArrowFileOps())
    if spec.format in ("parquet", "json", "delta"):
        if not spec.path:
            raise ValueError(f"sink.spark.path: required for format {spec.format}")
        fs: FileOps = ArrowFileOps() if remote else HadoopFileOps(session)
        if spec.format == "delta":
            return DeltaWriter(spec.path, spec.partition_by, fs)
        return FileWriter(spec.format, spec.path, spec.partition_by, fs)
    if spec.jdbc is None:
        raise ValueError("sink.spark.jdbc: required for format jdbc")
    statements: Statements = (
        PsycopgStatements(spec.jdbc) if remote else JvmStatements(session, spec.jdbc)
    )
    return JdbcWriter(spec, statements)
