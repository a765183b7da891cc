"""Spark as a cluster, not one JVM (issue 41): a standalone master and two workers from the
pyspark wheel's jars, behind ``submit.mode: connect``.

The Connect server is the driver; each batch's tasks run on executors, JVMs the two workers
start for the application. One executor is SIGKILLed while the worker is writing batches:
Spark retries the lost tasks on the other executor (and the worker starts a new one), and the
lake holds every record exactly once, read back with pyarrow.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.reports import lost_and_duplicated, report
from support.servers import started
from support.workers import WorkerProcess, manifest, produce, wait_caught_up, write_manifest

from offtake_testbed.kafka import KafkaBroker
from offtake_testbed.spark_standalone import SparkClusterError, StandaloneCluster

from .connect_server import ConnectServer
from .test_crash_on_kafka import _batches, _data_files, start, value
from .test_crash_on_kafka import workers as workers  # the fixture

pytestmark = pytest.mark.spark

RECORDS = 12_000
PARTITIONS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    with started(StandaloneCluster(workers=2, cores=1, memory="1g"), SparkClusterError) as c:
        print(f"\nSpark standalone master {c.master_url}, 2 workers, in {c.started_seconds:.1f}s")
        yield c


@pytest.fixture(scope="module")
def cluster_connect(cluster: StandaloneCluster) -> Iterator[ConnectServer]:
    """A Connect server whose master is the cluster: it holds one executor on each worker."""
    conf = {
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        # Tasks of a lost executor are retried elsewhere; the default (4) is kept explicit.
        "spark.task.maxFailures": "4",
    }
    server = ConnectServer(master=cluster.master_url, conf=conf)
    with started(server, RuntimeError) as s:
        yield s


def _tasks_run(cluster: StandaloneCluster) -> dict[str, int]:
    """Tasks each worker's executors have started so far, from their own logs."""
    counts: dict[str, int] = {}
    for work in sorted(p for p in cluster.root.glob("worker-*") if p.is_dir()):
        n = 0
        for stderr in work.glob("app-*/*/stderr"):
            n += stderr.read_text(errors="replace").count("Running task")
        counts[work.name] = n
    return counts


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_executor_killed_mid_batch_loses_and_duplicates_nothing(
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    cluster: StandaloneCluster,
    cluster_connect: ConnectServer,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    topic = topic_factory(PARTITIONS)
    table = tmp_path / "table"
    produced = produce(kafka_broker.bootstrap, topic, (value(i) for i in range(RECORDS)))
    doc = manifest(
        "spark-cluster",
        kafka_broker.bootstrap,
        [topic],
        sink={
            "spark": {
                "format": "parquet",
                "path": str(table),
                "batch": {"maxRecords": 1000, "maxIntervalSeconds": 2},
                "submit": {"mode": "connect", "connectUrl": cluster_connect.url},
            }
        },
    )
    path = write_manifest(tmp_path / "pipeline.yaml", doc)
    group = doc["spec"]["source"]["groupId"]
    worker = start(workers, path, tmp_path / "w.log")

    # Both workers hold an executor of the Connect server's application, and a batch is
    # being written (an executor has started a task since the first batch landed).
    _wait(lambda: len(cluster.executors()) == 2, 120, "an executor on each Spark worker")
    _wait(lambda: _batches(table) >= 1, 180, "the first batch in the lake")
    before = sum(_tasks_run(cluster).values())
    _wait(lambda: sum(_tasks_run(cluster).values()) > before, 120, "a task of a later batch")
    victim = cluster.executors()[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = _batches(table)

    wait_caught_up(kafka_broker.bootstrap, group, topic, PARTITIONS, timeout=300)
    assert worker.terminate() == 0, worker.output()[-4000:]

    import pyarrow.dataset as ds

    files = [str(table / f) for f in _data_files(table)]
    rows = ds.dataset(files, format="parquet").to_table(columns=["id"])
    counts = Counter(int(i) for i in rows.column("id").to_pylist())
    lost, duplicated = lost_and_duplicated(produced, counts)
    tasks = _tasks_run(cluster)
    report(
        "spark-standalone-executor-killed",
        produced=produced,
        rows_written=rows.num_rows,
        lost=lost,
        duplicated=duplicated,
        batches=_batches(table),
        batches_when_killed=killed_at,
        tasks_per_worker=tasks,
    )
    assert (lost, duplicated) == (0, 0)
    # The batches ran on executors of both workers, in JVMs other than the driver's.
    assert all(n > 0 for n in tasks.values()), tasks
    assert victim not in cluster.executors()
    driver_log = cluster_connect.log_path.read_text(errors="replace")
    assert "Lost executor" in driver_log, cluster_connect.tail()
