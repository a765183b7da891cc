"""``offtake redrive``: replay a pipeline's dead letters through the pipeline, once.

Each dead letter (``errors.dlq.topic``, or any topic Offtake dead-lettered to) goes back to the
topic and partition it came from (its ``offtake.original.*`` headers) with its original key,
value and headers, less Offtake's own ``offtake.*`` headers, plus ``offtake.redrive.id`` (this
redrive) and ``offtake.redrive.source`` (``<dlq topic>/<partition>/<offset>``). The pipeline's
workers then consume it like any other record.

Left where they are, and counted:

- ``left``: in each partition, the first dead letter stamped after ``until`` (the dead letter's
  record timestamp: when it failed) or carrying this redrive's own id (a replayed record that
  failed again: replaying it again in the same redrive could loop forever), and everything
  behind it. The partition's position stays there, so the next redrive (another id) starts
  with it: a dead-letter partition is a queue that each redrive drains up to its ``until``, and
  none passes over a dead letter;
- ``skipped``: records without ``offtake.original.topic`` (not Offtake's dead letters) and dead
  letters of topics the pipeline does not consume (a DLQ shared by several pipelines);
- ``rejected``: dead letters whose ``offtake.*`` headers are not what Offtake writes there (a
  partition that is not an int32 or not a partition of the topic, an offset that is not a
  non-negative int, ...): each is logged with the header at fault and the dead letter's
  ``<dlq topic>/<partition>/<offset>``, named in the summary, and passed over; it stays in the
  dead-letter topic. One bad dead letter never stops the redrive.

Headers are read strictly (:mod:`offtake.engine.header_values`), each from its last copy: the
worker appends its own headers after those it carries over and renames a producer's own
``offtake.*`` headers to ``producer.offtake.*`` (:func:`~offtake.engine.dead_letters.dlq_headers`),
so the last copy is the one Offtake wrote, and a producer cannot point a dead letter at another
topic or partition than the one it was consumed from.

Once: progress is committed to the pipeline's redrive group (``<groupId>.redrive``) after every
batch, and only after the batch's records are acknowledged by the brokers (idempotent
producer, ``acks=all``). A redrive that is stopped or crashes resumes from its last commit, and
the next redrive starts where the previous one stopped, so a dead letter is replayed once; a
crash between the produce and the commit replays that batch again (at-least-once, at most one
batch of duplicates). Each commit's metadata carries the redrive's id and the partition's
running counts, so the totals survive restarts and anyone (the operator) can read them from
Kafka.

A redrive reads each partition up to the end it had when the redrive started (the end is
known by the partition-EOF event, which also copes with transaction markers in a DLQ written
with exactly-once) and stops there. Replayed records keep their key and partition, so per-key
order among the replayed records is kept; they get a new timestamp (now), so that a topic's
time-based retention does not delete them the moment they arrive.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from offtake.config import PipelineSpec, RedriveRequest
from offtake.config.spec import matching_topics
from offtake.engine.dead_letters import read_origin
from offtake.engine.header_values import HeaderError, last
from offtake.errors import OfftakeError
from offtake.headers import H_REDRIVE_ID, H_REDRIVE_SOURCE, H_TOPIC, OFFTAKE_PREFIX
from offtake.kafka.config import consumer_config, producer_config

log = logging.getLogger("offtake.redrive")


BATCH = 500
MAX_REJECTIONS_SHOWN = 10  # reasons kept for the summary; the log has every one


class RedriveError(OfftakeError):
    """A redrive cannot run; the message names the field or option at fault."""


@dataclass
class Counts:
    replayed: int = 0
    left: int = 0
    skipped: int = 0
    rejected: int = 0

    def add(self, other: Counts) -> None:
        self.replayed += other.replayed
        self.left += other.left
        self.skipped += other.skipped
        self.rejected += other.rejected

    def count(self, verdict: str) -> None:
        """One dead letter more: ``left``, ``replay``(ed), ``rejected``, else ``skipped``."""
        if verdict == "left":
            self.left += 1
        elif verdict == "replay":
            self.replayed += 1
        elif verdict == "rejected":
            self.rejected += 1
        else:
            self.skipped += 1

    def metadata(self, request_id: str) -> str:
        return json.dumps(
            {
                "id": request_id,
                "replayed": self.replayed,
                "left": self.left,
                "skipped": self.skipped,
                "rejected": self.rejected,
            }
        )

    @classmethod
    def from_metadata(cls, text: str | None, request_id: str) -> Counts:
        """The counts a commit recorded for ``request_id`` (zero if it was another redrive's)."""
        try:
            raw = json.loads(text or "{}")
        except ValueError:
            raw = {}
        if not isinstance(raw, dict) or raw.get("id") != request_id:
            return cls()
        return cls(*(_count(raw.get(k)) for k in ("replayed", "left", "skipped", "rejected")))


def _count(value: Any) -> int:
    """A count from a commit's metadata (which anyone in the group can write): 0 unless an int."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class RedriveResult:
    group: str
    topic: str
    totals: Counts
    #: partition -> the offset committed (the next dead letter to look at).
    positions: dict[int, int] = field(default_factory=dict)
    #: Why dead letters were rejected (the first few, this run): header, value, where.
    rejections: list[str] = field(default_factory=list)

    def summary(self, request: RedriveRequest) -> dict[str, Any]:
        return {
            "id": request.id,
            "from": request.source,
            "until": request.until_text,
            "group": self.group,
            "replayed": self.totals.replayed,
            "left": self.totals.left,
            "skipped": self.totals.skipped,
            "rejected": self.totals.rejected,
            **({"rejections": self.rejections} if self.rejections else {}),
        }


def _consumer_conf(base: Mapping[str, Any], group: str) -> dict[str, Any]:
    conf = dict(base)
    for key in ("group.instance.id", "partition.assignment.strategy", "group.protocol"):
        conf.pop(key, None)
    conf.update(
        {
            "group.id": group,
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "true",
            # Dead letters of an exactly-once pipeline are written in its transactions.
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    return conf


def _partitions(consumer: Consumer, topic: str, timeout: float) -> list[int] | None:
    meta = consumer.list_topics(topic, timeout=timeout)
    found = meta.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return sorted(found.partitions)


def read_progress(
    config: Mapping[str, Any], group: str, topic: str, request_id: str, timeout: float = 10.0
) -> RedriveResult | None:
    """What the redrive group has committed for ``topic``: redrive ``request_id``'s totals and
    the positions (None if the topic does not exist). The operator reports a finished redrive
    with it."""
    consumer = Consumer(_consumer_conf(config, group))
    try:
        partitions = _partitions(consumer, topic, timeout)
        if partitions is None:
            return None
        result = RedriveResult(group, topic, Counts())
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout)
        for tp in committed:
            if tp.offset >= 0:
                result.positions[tp.partition] = tp.offset
                result.totals.add(Counts.from_metadata(tp.metadata, request_id))
        return result
    finally:
        consumer.close()


Headers = list[tuple[str, str | bytes | None]]


def _headers(msg: Message) -> Headers:
    return list(cast(Headers, msg.headers() or []))


class _Replayer:
    def __init__(self, spec: PipelineSpec, request: RedriveRequest, producer: Producer) -> None:
        self.spec = spec
        self.request = request
        self.producer = producer
        # The source topics the dead letters may go back to; patterns resolved by _replayer().
        self.topics = set(spec.source.topics)
        self.target_partitions: dict[str, int] = {}
        self.failures: list[str] = []
        #: Why dead letters were rejected (the first MAX_REJECTIONS_SHOWN of this run).
        self.rejections: list[str] = []

    def flush(self, request_id: str, timeout: float) -> None:
        """Wait for the batch's acknowledgements; RedriveError if any record was not acked."""
        remaining = self.producer.flush(timeout)
        if remaining or self.failures:
            raise RedriveError(
                f"redrive {request_id}: {remaining} record(s) not acknowledged; "
                + "; ".join(self.failures[:3])
            )

    def reject(self, msg: Message, why: str) -> str:
        where = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        log.warning("redrive %s: dead letter %s not replayed: %s", self.request.id, where, why)
        if len(self.rejections) < MAX_REJECTIONS_SHOWN:
            self.rejections.append(f"{where}: {why}")
        return "rejected"

    def classify(self, msg: Message) -> str:
        """``replay``, ``left``, ``skipped`` or ``rejected``; replays it in the first case."""
        headers = _headers(msg)
        raw_topic = last(headers, H_TOPIC)
        if raw_topic is None or raw_topic.decode("utf-8", "replace") not in self.topics:
            return "skipped"
        _kind, stamp = msg.timestamp()
        if stamp > self.request.until_ms or last(headers, H_REDRIVE_ID) == self.request.id.encode():
            # Newer than until, or replayed by this very redrive and failed again (replaying it
            # again now could loop forever): left for the next redrive.
            return "left"
        try:
            origin = read_origin(headers)
        except HeaderError as exc:
            return self.reject(msg, str(exc))
        assert origin is not None  # its topic header is there (above)
        topic = origin.topic
        # Offtake's own headers are dropped from replayed records.
        kept = [(k, v) for k, v in headers if not k.startswith(OFFTAKE_PREFIX)]
        kept += [
            (H_REDRIVE_ID, self.request.id.encode()),
            (H_REDRIVE_SOURCE, f"{msg.topic()}/{msg.partition()}/{msg.offset()}".encode()),
        ]
        kwargs: dict[str, Any] = {}
        count = self.target_partitions.get(topic, 0)
        if origin.partition is not None and count:
            if origin.partition >= count:
                return self.reject(
                    msg,
                    f"header offtake.original.partition: {origin.partition} is not a partition "
                    f"of {topic} ({count} partitions)",
                )
            kwargs["partition"] = origin.partition  # the same partition: per-key order holds

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self.failures.append(f"replay to {topic} failed: {err}")

        while True:
            try:
                self.producer.produce(
                    topic,
                    value=msg.value(),
                    key=msg.key(),
                    headers=kept,
                    on_delivery=delivered,
                    **kwargs,
                )
                break
            except BufferError:  # the producer's queue is full: let deliveries drain it
                self.producer.poll(0.1)
        return "replay"


def redrive(
    spec: PipelineSpec,
    request: RedriveRequest,
    group: str,
    *,
    timeout: float = 30.0,
    on_batch: Callable[[RedriveResult], None] | None = None,
) -> RedriveResult:
    """Replay the dead letters of ``request.source`` into the pipeline's source topics."""
    consumer = Consumer(_consumer_conf(consumer_config(spec), group))
    producer = Producer(producer_config(spec, {"client.id": f"offtake-{spec.name}-redrive"}))
    try:
        return _run(spec, request, group, consumer, producer, timeout, on_batch)
    finally:
        consumer.close()
        producer.flush(timeout)


def _run(
    spec: PipelineSpec,
    request: RedriveRequest,
    group: str,
    consumer: Consumer,
    producer: Producer,
    timeout: float,
    on_batch: Callable[[RedriveResult], None] | None,
) -> RedriveResult:
    topic = request.source
    partitions = _partitions(consumer, topic, timeout)
    if partitions is None:
        raise RedriveError(f"spec.redrive.from: the dead-letter topic {topic!r} does not exist")
    replayer = _replayer(spec, request, producer, consumer, timeout)
    result = RedriveResult(group, topic, Counts())
    counts, start, ends = _positions(consumer, topic, partitions, request.id, timeout)
    pending = {p for p in partitions if start[p] < ends[p]}
    result.positions = dict(start)
    #: Partitions whose position stays at their first dead letter newer than until.
    held: set[int] = set()
    if pending:
        consumer.assign([TopicPartition(topic, p, start[p]) for p in sorted(pending)])
    log.info(
        "redrive %s: %s partition(s) of %s to read, group %s",
        request.id,
        len(pending),
        topic,
        group,
    )

    def finished(p: int) -> None:
        if p in pending:
            pending.discard(p)
            consumer.pause([TopicPartition(topic, p)])

    while pending:
        messages = consumer.consume(BATCH, timeout=1.0)
        touched: set[int] = set()
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    finished(_int(msg.partition()))
                    continue
                if err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue
            p = _int(msg.partition())
            offset = _int(msg.offset())
            if p not in pending or offset >= ends[p]:
                # Written after the redrive started (a replayed record that failed again, say):
                # for the next redrive.
                finished(p)
                continue
            verdict = "left" if p in held else replayer.classify(msg)
            counts[p].count(verdict)
            if p not in held:
                if verdict == "left":
                    # The partition is a queue: the next redrive starts here, so nothing newer
                    # than this redrive's until is ever passed over.
                    held.add(p)
                if p not in held:
                    result.positions[p] = offset + 1
                touched.add(p)
            if offset + 1 >= ends[p]:
                finished(p)
        if not touched:
            continue
        replayer.flush(request.id, timeout)
        _commit(consumer, result, counts, request.id, touched)
        result.rejections = replayer.rejections
        if on_batch is not None:
            result.totals = _sum(counts)
            on_batch(result)
    # Every partition's position and this redrive's counts, also where there was nothing to
    # read: the group then tells the whole story of this id.
    _commit(consumer, result, counts, request.id, partitions)
    result.totals = _sum(counts)
    result.rejections = replayer.rejections
    return result


def _replayer(
    spec: PipelineSpec,
    request: RedriveRequest,
    producer: Producer,
    consumer: Consumer,
    timeout: float,
) -> _Replayer:
    """The replayer, knowing the source topics (those the patterns match now) and their
    partition counts."""
    replayer = _Replayer(spec, request, producer)
    if spec.source.patterns:  # the topics the patterns match now
        existing = consumer.list_topics(timeout=timeout).topics
        replayer.topics = set(matching_topics(spec.source.topics, existing))
    for target in replayer.topics:
        found = _partitions(consumer, target, timeout)
        replayer.target_partitions[target] = len(found or [])
    return replayer


def _positions(
    consumer: Consumer, topic: str, partitions: list[int], request_id: str, timeout: float
) -> tuple[dict[int, Counts], dict[int, int], dict[int, int]]:
    """Per DLQ partition: this redrive's counts so far, where to start, and its end now."""
    counts: dict[int, Counts] = {}
    start: dict[int, int] = {}
    committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout)
    for tp in committed:
        previous = Counts.from_metadata(tp.metadata if tp.offset >= 0 else None, request_id)
        # Resuming this redrive: its replayed, skipped and rejected dead letters are behind the
        # position; what is left beyond it is counted afresh.
        counts[tp.partition] = Counts(
            replayed=previous.replayed, skipped=previous.skipped, rejected=previous.rejected
        )
        start[tp.partition] = tp.offset
    ends: dict[int, int] = {}
    for p in partitions:
        low, ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)
        start[p] = max(start[p], low)  # never committed (negative), or below the retention
    return counts, start, ends


def _commit(
    consumer: Consumer,
    result: RedriveResult,
    counts: dict[int, Counts],
    request_id: str,
    parts: set[int] | list[int],
) -> None:
    """Commit these DLQ partitions' positions, each with this redrive's counts as metadata."""
    consumer.commit(
        offsets=[
            TopicPartition(
                result.topic, p, result.positions[p], metadata=counts[p].metadata(request_id)
            )
            for p in sorted(parts)
        ],
        asynchronous=False,
    )


def _int(value: int | None) -> int:
    assert value is not None  # set on every consumed record
    return value


def _sum(counts: Mapping[int, Counts]) -> Counts:
    total = Counts()
    for c in counts.values():
        total.add(c)
    return total
