"""``kubectl offtake dlq``: a pipeline's dead letters, newest first, decoded as it decodes.

Reads the DLQ topic with a consumer that is assigned (never subscribed) and never commits, so
reading changes no group's position and no one's partitions. Values are decoded with the
worker's own decoders for ``source.format`` (schema formats through the registry, by the
topic the record came from), but Protobuf, whose message class is a module the tenant names:
raw fields unless the admin passes ``--import`` (protobuf_raw); where it came from and why it
failed are Offtake's headers, read with the worker's strict readers. What reaches the terminal
is escaped (terminal).
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from offtake.contract import (
    H_ATTEMPTS,
    H_ERROR_CLASS,
    H_ERROR_MESSAGE,
    H_STAGE,
    DecodeError,
    Decoder,
    HeaderError,
    PipelineSpec,
    decoder_for,
    header,
    read_int,
    read_origin,
)

from .errors import PluginError
from .kafka_view import KafkaAccess
from .protobuf_raw import RawProtobufDecoder
from .terminal import one_line

JSON = dict[str, Any]
#: Records read per partition at most when searching (--grep or --since): a bound on the time
#: a search of a large DLQ takes from a terminal.
SCAN_LIMIT = 10000


@dataclass(frozen=True)
class Query:
    limit: int
    since_ms: int | None
    grep: re.Pattern[str] | None
    #: The admin's --import: decode Protobuf with the module source.protobufMessage names
    #: (imported, so run, on this machine); without it, raw fields (protobuf_raw).
    import_modules: bool = False


def _seek_offsets(
    consumer: Any, topic: str, partitions: Sequence[int], query: Query, timeout: float
) -> list[tuple[int, int, int]]:
    """(partition, from, to) per partition: the newest ``limit`` records, or those since."""
    out = []
    for p in partitions:
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(topic, p), timeout=timeout, cached=False
        )
        window = query.limit if query.grep is None and query.since_ms is None else SCAN_LIMIT
        start = max(low, high - window)
        if query.since_ms is not None:
            (found,) = consumer.offsets_for_times(
                [confluent_kafka.TopicPartition(topic, p, query.since_ms)], timeout=timeout
            )
            start = max(start, found.offset if found.offset >= 0 else high)
        if start < high:
            out.append((p, start, high))
    return out


def read(access: KafkaAccess, topic: str, query: Query, timeout: float) -> list[JSON]:
    conf = {k: v for k, v in access.conf.items() if not callable(v)}
    conf.update(
        {
            # An id of its own, never committed to: librdkafka wants one even to assign.
            "group.id": f"{access.spec.source.group_id}.offtake-kubectl",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
        }
    )
    consumer = confluent_kafka.Consumer(conf)
    try:
        meta = consumer.list_topics(topic=topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise PluginError(f"the dead-letter topic {topic!r} does not exist (yet)")
        ranges = _seek_offsets(consumer, topic, sorted(meta.partitions), query, timeout)
        consumer.assign([confluent_kafka.TopicPartition(topic, p, lo) for p, lo, _ in ranges])
        ends = {p: hi for p, _, hi in ranges}
        messages: list[Any] = []
        deadline = time.monotonic() + timeout + 0.01 * sum(hi - lo for _, lo, hi in ranges)
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                partition, offset = msg.partition() or 0, msg.offset() or 0
                error = msg.error()
                if error is not None:
                    # The end of a partition whose last offsets hold no record (transaction
                    # markers, compaction): nothing more to read there.
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        ends.pop(partition, None)
                    continue
                if offset < ends.get(partition, -1):
                    messages.append(msg)
                if offset >= ends.get(partition, 0) - 1:
                    ends.pop(partition, None)
        if ends:
            raise PluginError(f"reading {topic!r} timed out; partitions not read: {sorted(ends)}")
    finally:
        consumer.close()
    decoder = _decoder(access.spec, query.import_modules)
    letters = [describe(m, access.spec, decoder) for m in messages]
    if query.grep is not None:
        grep = query.grep
        letters = [d for d in letters if grep.search(json.dumps(d, default=str))]
    letters.sort(key=lambda d: (d["timestamp"] or 0, d["offset"]), reverse=True)
    return letters[: query.limit]


def _decoded(raw: bytes | None, topic: str, decoder: Decoder) -> Any:
    if raw is None:
        return None
    try:
        value = decoder.value(raw, topic)
    except DecodeError as exc:
        # A record that failed to decode is a common dead letter: show what it holds.
        shown = raw[:200].decode("utf-8", "replace")
        return {"undecodable": f"not valid {decoder.format}: {exc}", "raw": shown}
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    return value


def _decoder(spec: PipelineSpec, import_modules: bool) -> Decoder:
    """One per run (a schema format's decoder holds a registry client and its cache). The
    worker's own decoder, but for Protobuf without ``import_modules``: the tenant names the
    module, and importing it runs its code on the admin's machine."""
    if spec.source.format == "protobuf" and not import_modules:
        return RawProtobufDecoder()
    return decoder_for(spec.source)


def describe(msg: Any, spec: PipelineSpec, decoder: Decoder) -> JSON:
    headers = msg.headers() or []
    try:
        origin = read_origin(headers)
        attempts = read_int(headers, H_ATTEMPTS)
        bad_header = None
    except HeaderError as exc:
        origin, attempts, bad_header = None, None, str(exc)
    ts_type, ts = msg.timestamp()
    key = msg.key()
    source_topic = origin.topic if origin is not None else msg.topic()
    out: JSON = {
        "topic": msg.topic(),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": ts if ts_type and ts >= 0 else None,
        "time": _iso(ts) if ts_type and ts >= 0 else None,
        "origin": None
        if origin is None
        else {"topic": origin.topic, "partition": origin.partition, "offset": origin.offset},
        "error": {
            "class": header(headers, H_ERROR_CLASS),
            "message": header(headers, H_ERROR_MESSAGE),
            "stage": header(headers, H_STAGE),
        },
        "attempts": attempts,
        "key": None if key is None else key.decode("utf-8", "replace"),
        "value": _decoded(msg.value(), source_topic, decoder),
    }
    if bad_header is not None:
        out["headerError"] = bad_header
    return out


def _iso(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def render(letters: Sequence[JSON], topic: str) -> str:
    """The text a terminal shows: every value from the record or its headers on one line,
    its control characters escaped (terminal.one_line)."""
    if not letters:
        return f"no dead letters in {one_line(topic)} match"
    lines = []
    for d in letters:
        o = d["origin"]
        where = "origin unknown" if o is None else f"{o['topic']}[{o['partition']}]@{o['offset']}"
        e = d["error"]
        attempts = "-" if d["attempts"] is None else d["attempts"]
        lines.append(
            f"{d['time'] or '-'}  {one_line(where)}  attempts {attempts}  "
            f"{one_line(e['class'] or '-')}"
        )
        lines.append(
            f"  error: {one_line(e['message'] or '-')}  (stage {one_line(e['stage'] or '-')})"
        )
        lines.append(f"  key:   {one_line(d['key'])}")
        # json.dumps writes every control character as \uXXXX already; one_line keeps to the rule.
        lines.append(f"  value: {one_line(json.dumps(d['value'], default=str)[:500])}")
        lines.append(f"  at:    {one_line(d['topic'])}[{d['partition']}]@{d['offset']}")
        if "headerError" in d:
            lines.append(f"  note:  {one_line(d['headerError'])}")
    lines.append(f"{len(letters)} dead letter(s) from {one_line(topic)}, newest first")
    return "\n".join(lines)
