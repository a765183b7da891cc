"""Helpers for the Spark sink tests: specs, items, a settlement collector, table readers, the
engine with the Spark sink on a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from offtake.config.loader import parse_pipeline
from offtake.config.spec import PipelineSpec
from offtake.engine.assembly import build_worker
from offtake.engine.worker import Worker
from offtake.metrics import Metrics
from offtake.records import Record
from offtake.sinks.base import SinkBatch, SinkItem
from offtake.sinks.spark import SparkSink, make_spark_sink
from offtake.sinks.spark.writers import Writer


def pipeline(
    spark: Mapping[str, Any],
    *,
    fmt: str = "json",
    errors: Mapping[str, Any] | None = None,
    name: str = "spark-test",
) -> PipelineSpec:
    doc = {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": name, "namespace": "test"},
        "spec": {
            "kafka": {"bootstrapServers": "unused:9092"},
            "source": {"topics": ["orders"], "format": fmt},
            "sink": {"spark": dict(spark)},
            "errors": dict(
                errors or {"policy": "skip", "maxRetries": 2, "retryBackoffSeconds": 0.01}
            ),
        },
    }
    return parse_pipeline(doc)


def item(
    offset: int,
    value: Any = None,
    *,
    topic: str = "orders",
    partition: int = 0,
    key: bytes | None = None,
    epoch: int = 0,
) -> SinkItem:
    if value is None:
        value = {"id": offset, "amount": offset * 1.5, "customer": f"c{offset % 7}"}
    rec = Record(
        topic,
        partition,
        offset,
        key if key is not None else f"k{offset}".encode(),
        value,
        (),
        1_700_000_000_000 + offset,
        b"raw",
    )
    return SinkItem(rec, [value], epoch=epoch)


def items(offsets: Iterable[int], **kw: Any) -> list[SinkItem]:
    return [item(o, **kw) for o in offsets]


class Collector:
    """The engine's side of on_settled: records every settled record (with its error)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: list[SinkItem] = []
        self.failed: list[tuple[SinkItem, BaseException]] = []
        self.threads: set[str] = set()

    def __call__(self, batch: SinkBatch, failed: Mapping[int, BaseException]) -> None:
        with self.lock:
            self.threads.add(threading.current_thread().name)
            for i, it in enumerate(batch.items):
                error = failed.get(i)
                if error is None:
                    self.ok.append(it)
                else:
                    self.failed.append((it, error))

    @property
    def count(self) -> int:
        return len(self.ok) + len(self.failed)


def run_sink(
    spec: PipelineSpec,
    session: Any,
    batches_of: Iterable[list[SinkItem]],
    timeout: float = 240.0,
    metrics: Metrics | None = None,
    writer: Writer | None = None,
) -> tuple[Collector, SparkSink]:
    """Start a sink, submit everything, drain all, close; return what completed."""
    metrics = metrics or Metrics("test")
    sink = SparkSink(spec, metrics, session=session, writer=writer)
    done = Collector()
    sink.start(done)
    total = 0
    for chunk in batches_of:
        for it in chunk:
            sink.submit(SinkBatch.of([it]))
            total += 1
        sink.poll()
    deadline = time.monotonic() + timeout
    while done.count < total and time.monotonic() < deadline:
        sink.drain(None, 1.0)
    sink.close()
    return done, sink


class EngineThread:
    """The pipeline ``doc``'s engine on a thread, with the Spark sink on the shared session
    ``spark`` (a worker process would start a session of its own)."""

    def __init__(self, doc: dict[str, Any], spark: Any) -> None:
        spec = parse_pipeline(doc)
        metrics = Metrics(spec.name)
        sink = make_spark_sink(spec, metrics, session=spark)
        self.worker: Worker = build_worker(spec, sink=sink, metrics=metrics)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.worker.run()

    def stop(self) -> int | None:
        """Stop the engine; its exit code (None: still running after a minute)."""
        self.worker.stop()
        self.thread.join(60)
        return self.code


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@contextlib.contextmanager
def password_checked_role(postgres: Any, role: str, password: str) -> Iterator[None]:
    """A role of the test bed's PostgreSQL whose password is checked (scram-sha-256): the
    server trusts local connections, so a pg_hba line for this one role, first, makes the
    password count; removed again afterwards. The role may create tables in ``public``."""
    import psycopg

    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    assert row is not None
    hba = Path(row[0])
    original = hba.read_text()

    def reload(text: str) -> None:
        hba.write_text(text)
        with psycopg.connect(postgres.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")

    reload(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
    try:
        yield
    finally:
        reload(original)
