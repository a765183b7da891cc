"""Every sink implementation behind one harness, for the sink contract suite.

Each case builds its sink the way the engine does (``assembly.make_sink``, or
``make_spark_sink`` with the shared session), reads back what landed at the destination, and
says through :class:`Capabilities` where it legitimately differs from the others. The test
bodies in test_sink_contract.py are the same for every case.

Values are dicts ``{"src_partition", "src_offset", "n"}`` (``n``: the value's index within
its record), so what landed can be compared with what was submitted whatever the format.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from offtake.config.loader import parse_pipeline
from offtake.config.spec import PipelineSpec
from offtake.engine.assembly import make_sink
from offtake.kafka.memory import MemoryBroker
from offtake.metrics import Metrics
from offtake.records import Record, TopicPartition
from offtake.sinks.base import Sink, SinkBatch, SinkItem
from offtake.sinks.kafka import KafkaSink
from offtake.sinks.kafka_transactional import TransactionalKafkaSink, TransactionFailed
from offtake.sinks.log import LogSink
from offtake.sinks.spark import SparkSink, make_spark_sink

SOURCE_TOPIC = "orders"
SETTLE_SECONDS = 240.0  # a first Spark job on a busy two-core machine can take a while

Value = tuple[int, int, int]  # (src_partition, src_offset, n)


@dataclass(frozen=True)
class Capabilities:
    """Where a sink legitimately differs; the tests branch on these, never skip.

    ``abandon_withholds_writes``: an abandoned item's values are never written (a batch sink
    holds them until its job); a record sink has sent them already and cannot take them back.
    ``failure``: how a destination that refuses writes shows: each record failed in its
    batch's settlement, or the open transaction doomed
    (the exactly-once sink: a record's fate is its transaction's; the commit aborts, and the
    engine consumes the records again).
    ``can_hold``: the harness can hold writes at the destination, so a drain can run out of
    time; a sink that writes inside ``submit`` has nothing left to wait for.
    """

    abandon_withholds_writes: bool
    failure: Literal["error-settlement", "dooms-transaction"]
    can_hold: bool


def tp(partition: int) -> TopicPartition:
    return TopicPartition(SOURCE_TOPIC, partition)


def make_item(partition: int, offset: int, n_values: int = 1, epoch: int = 0) -> SinkItem:
    values = [{"src_partition": partition, "src_offset": offset, "n": n} for n in range(n_values)]
    record = Record(
        SOURCE_TOPIC,
        partition,
        offset,
        f"k{partition}-{offset}".encode(),
        values[0] if values else None,
        (("trace", b"t1"),),
        1_700_000_000_000 + offset,
        b"raw",
    )
    return SinkItem(record, values, epoch=epoch)


def values_of(items: Collection[SinkItem]) -> list[Value]:
    return sorted((v["src_partition"], v["src_offset"], v["n"]) for it in items for v in it.values)


def _as_value(d: dict[str, Any]) -> Value:
    return (int(d["src_partition"]), int(d["src_offset"]), int(d["n"]))


def pipeline(sink: dict[str, Any], *, bootstrap: str = "unused:9092") -> PipelineSpec:
    return parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "contract", "namespace": "test"},
            "spec": {
                "kafka": {"bootstrapServers": bootstrap},
                "source": {"topics": [SOURCE_TOPIC], "format": "json"},
                "sink": sink,
                "errors": {"policy": "skip", "maxRetries": 1, "retryBackoffSeconds": 0.01},
            },
        }
    )


class SinkCase(ABC):
    """One sink implementation with its destination."""

    caps: Capabilities
    sink: Sink

    @abstractmethod
    def written(self) -> list[Value]:
        """Every value that landed at the destination, sorted (duplicates kept)."""

    @abstractmethod
    def break_destination(self) -> None:
        """Make every later write fail."""

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold writes at the destination inside the block (only when ``caps.can_hold``)."""
        raise AssertionError(f"{type(self).__name__} cannot hold writes")
        yield  # pragma: no cover

    def cleanup(self) -> None:
        self.sink.close()


class LogCase(SinkCase):
    """The log sink on stdout, read back through pytest's capsys."""

    caps = Capabilities(abandon_withholds_writes=False, failure="error-settlement", can_hold=False)

    def __init__(self, capsys: Any) -> None:
        self.capsys = capsys
        self.sink = make_sink(pipeline({"log": {}}), MemoryBroker().clients(), Metrics("t"))
        self._lines: list[str] = []

    def written(self) -> list[Value]:
        self._lines += self.capsys.readouterr().out.splitlines()
        out = []
        for line in self._lines:
            doc = json.loads(line)
            value = doc["value"]
            assert (doc["topic"], doc["partition"], doc["offset"]) == (
                SOURCE_TOPIC,
                value["src_partition"],
                value["src_offset"],
            ), f"log line names another record than its value: {line}"
            out.append(_as_value(value))
        return sorted(out)

    def break_destination(self) -> None:
        assert isinstance(self.sink, LogSink)
        self.sink.stream = _BrokenStream()


class _BrokenStream:
    def write(self, text: str) -> int:
        raise OSError("stdout is closed (contract test)")

    def flush(self) -> None:
        raise OSError("stdout is closed (contract test)")


class MemoryKafkaCase(SinkCase):
    """The Kafka sink producing to the in-memory broker."""

    caps = Capabilities(abandon_withholds_writes=False, failure="error-settlement", can_hold=True)

    def __init__(self) -> None:
        self.broker = MemoryBroker()
        self.topic = "contract-out"
        self.broker.create_topic(self.topic, 3)
        spec = pipeline({"kafka": {"topic": self.topic}})
        self.sink = make_sink(spec, self.broker.clients(), Metrics("t"))

    def written(self) -> list[Value]:
        return _decoded(m.value() for m in self.broker.records(self.topic))

    def break_destination(self) -> None:
        self.broker.fail_produce(self.topic, 1_000)

    @contextmanager
    def held(self) -> Iterator[None]:
        self.broker.stall(self.topic)
        try:
            yield
        finally:
            self.broker.unstall(self.topic)


class RealKafkaCase(SinkCase):
    """The Kafka sink producing to the test bed's broker, with confluent-kafka."""

    caps = Capabilities(abandon_withholds_writes=False, failure="error-settlement", can_hold=False)

    def __init__(self, bootstrap: str, topic: str) -> None:
        from offtake.engine.assembly import default_clients

        self.bootstrap = bootstrap
        self.topic = topic
        # A short delivery timeout: the broken destination's reports come back in seconds.
        spec = pipeline(
            {"kafka": {"topic": topic, "config": {"message.timeout.ms": "20000"}}},
            bootstrap=bootstrap,
        )
        self.sink = make_sink(spec, default_clients(), Metrics("t"))

    def written(self) -> list[Value]:
        from offtake_testbed.kafka import read_topic

        return _decoded(m.value() for m in read_topic(self.bootstrap, self.topic))

    def cleanup(self) -> None:
        super().cleanup()
        # KafkaSink.close leaves the producer to garbage collection, which a reference cycle
        # (sink -> callback -> harness -> sink) delays past the broker's stop: close it now.
        assert isinstance(self.sink, KafkaSink)
        self.sink.producer.close()  # type: ignore[attr-defined]

    def break_destination(self) -> None:
        # A name the broker refuses: every delivery report carries the broker's error.
        assert isinstance(self.sink, KafkaSink)
        self.sink.topic = "contract-invalid-topic-name!"


class RealKafkaTransactionalCase(RealKafkaCase):
    """The exactly-once Kafka sink (``delivery: exactly-once``) on the test bed's broker.

    What it wrote is what a read_committed reader sees once the open transaction commits, as
    the engine commits it after a drain (the consumed offsets are the engine's business, so
    none are sent here).
    """

    caps = Capabilities(abandon_withholds_writes=False, failure="dooms-transaction", can_hold=False)

    def __init__(self, bootstrap: str, topic: str) -> None:
        from offtake.engine.assembly import default_clients

        self.bootstrap = bootstrap
        self.topic = topic
        spec = pipeline(
            {
                "kafka": {
                    "topic": topic,
                    "delivery": "exactly-once",
                    "config": {"message.timeout.ms": "20000"},
                }
            },
            bootstrap=bootstrap,
        )
        # Its own transactional.id: a case must not fence another's producer.
        self.sink = make_sink(spec, default_clients(), Metrics("t"), f"contract-{topic}")

    def written(self) -> list[Value]:
        from offtake_testbed.kafka import read_topic

        assert isinstance(self.sink, TransactionalKafkaSink)
        if self.sink.in_transaction:
            # A delivery failed: the transaction aborts, and nothing of it is visible.
            with contextlib.suppress(TransactionFailed):
                self.sink.commit_transaction({}, None)
        return _decoded(m.value() for m in read_topic(self.bootstrap, self.topic))


class SparkParquetCase(SinkCase):
    """The Spark sink in local mode writing parquet into a temporary folder."""

    caps = Capabilities(abandon_withholds_writes=True, failure="error-settlement", can_hold=True)

    def __init__(self, session: Any, path: Path) -> None:
        self.session = session
        self.path = path
        spec = pipeline(
            {
                "spark": {
                    "format": "parquet",
                    "path": str(path),
                    # Batches close on drain, or on poll after a second: the tests decide.
                    "batch": {"maxRecords": 10_000, "maxIntervalSeconds": 1},
                }
            }
        )
        sink = make_spark_sink(spec, Metrics("t"), session=session)
        self.spark_sink: SparkSink = sink
        self.sink = sink
        self._gate = threading.Event()
        self._gate.set()

    def written(self) -> list[Value]:
        if not self.path.exists():
            return []
        rows = self.session.read.parquet(str(self.path)).select("src_partition", "src_offset", "n")
        return sorted(_as_value(r.asDict()) for r in rows.collect())

    def break_destination(self) -> None:
        def broken(df: Any) -> Any:
            raise RuntimeError("the table is read-only (contract test)")

        self.spark_sink.transform = broken

    @contextmanager
    def held(self) -> Iterator[None]:
        gate = self._gate

        def wait(df: Any) -> Any:
            gate.wait(SETTLE_SECONDS)
            return df

        gate.clear()
        self.spark_sink.transform = wait
        try:
            yield
        finally:
            gate.set()


def _decoded(payloads: Any) -> list[Value]:
    return sorted(_as_value(json.loads(p)) for p in payloads)


class Contract:
    """Drives a sink as the engine does and records what it reports.

    ``submit``, ``poll`` and ``drain`` run with a thread-local flag set, so a settlement that
    arrives from anywhere else (another thread, ``abandon``, ``close``) is caught. What it
    records is per record: each record of a settled batch, with its error if it failed.
    """

    def __init__(self, case: SinkCase) -> None:
        self.case = case
        self.sink = case.sink
        self.caps = case.caps
        self._inside = threading.local()
        self._lock = threading.Lock()
        self.settlements: list[tuple[SinkItem, BaseException | None]] = []
        self.outside_calls: list[str] = []
        self.sink.start(self._on_settled)

    def _on_settled(self, batch: SinkBatch, failed: Mapping[int, BaseException]) -> None:
        with self._lock:
            assert len(batch.offsets) == len(batch.items), "a batch's offsets are its records'"
            for i, item in enumerate(batch.items):
                assert item.tp == batch.tp, f"{item.record.where()} settled in {batch.tp}'s batch"
                self.settlements.append((item, failed.get(i)))
            if not getattr(self._inside, "call", False):
                self.outside_calls.append(threading.current_thread().name)

    @contextmanager
    def _call(self) -> Iterator[None]:
        self._inside.call = True
        try:
            yield
        finally:
            self._inside.call = False

    # -- the engine's calls ----------------------------------------------------------------
    def submit(self, *items: SinkItem) -> None:
        """Hand over one batch: the items (of one partition, in offset order)."""
        with self._call():
            self.sink.submit(SinkBatch.of(list(items)))

    def poll(self) -> None:
        with self._call():
            self.sink.poll()

    def drain(self, partitions: Collection[TopicPartition] | None, timeout: float) -> bool:
        with self._call():
            return self.sink.drain(partitions, timeout)

    def abandon(self, partitions: Collection[TopicPartition]) -> int:
        return self.sink.abandon(partitions)

    def close(self) -> None:
        self.sink.close()

    # -- what the engine saw ---------------------------------------------------------------
    def times_settled(self, item: SinkItem) -> int:
        with self._lock:
            return sum(1 for it, _ in self.settlements if it.record is item.record)

    def settled(self, items: Collection[SinkItem]) -> list[SinkItem]:
        with self._lock:
            done = {id(it.record) for it, _ in self.settlements}
        return [it for it in items if id(it.record) in done]

    def errors(self) -> list[BaseException]:
        with self._lock:
            return [e for _, e in self.settlements if e is not None]

    def settle(self, items: Collection[SinkItem], poll_only: bool = False) -> None:
        """Drive the sink until every item settled; fail if that takes unreasonably long."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while len(self.settled(items)) < len(items):
            assert time.monotonic() < deadline, (
                f"{len(items) - len(self.settled(items))} of {len(items)} item(s) never "
                f"settled within {SETTLE_SECONDS:g}s"
            )
            if poll_only:
                self.poll()
                time.sleep(0.02)
            else:
                self.drain(None, 1.0)
