"""``offtake redrive`` on the real broker: dead letters back to where they came from, once."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from support.workers import (
    WorkerProcess,
    manifest,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake import redrive as redrive_mod
from offtake.config import RedriveRequest, parse_pipeline, redrive_group
from offtake.engine.dead_letters import H_PARTITION, dlq_headers
from offtake.records import Record
from offtake_testbed.kafka import KafkaBroker

HOUR_MS = 3_600_000


def dead_letter(
    producer: Producer,
    dlq: str,
    topic: str,
    partition: int,
    offset: int,
    stamp_ms: int,
    *,
    headers: tuple[tuple[str, bytes | None], ...] = (),
    dlq_partition: int = 0,
) -> None:
    record = Record(
        topic,
        partition,
        offset,
        f"k{offset}".encode(),
        None,
        headers,
        stamp_ms,
        f"v{offset}".encode(),
    )
    producer.produce(
        dlq,
        value=record.raw_value,
        key=record.key,
        headers=dlq_headers(record, ValueError("boom"), 3, "process"),
        partition=dlq_partition,
        timestamp=stamp_ms,
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offtake.cli", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def setup(kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path) -> dict[str, Any]:
    source, other, dlq = topic_factory(3), topic_factory(1), topic_factory(2)
    doc = manifest(
        "redrive",
        kafka_broker.bootstrap,
        [source],
        sink={"log": {}},
        errors={"policy": "dlq", "dlq": {"topic": dlq}},
    )
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    # Six dead letters of our topic, 10 hours old, on both DLQ partitions ...
    for i in range(6):
        dead_letter(
            producer,
            dlq,
            source,
            i % 3,
            100 + i,
            now - 10 * HOUR_MS,
            headers=(("trace", f"t{i}".encode()),),
            dlq_partition=i % 2,
        )
    # ... two newer than the redrive's until, one of another pipeline's topic, one not ours.
    dead_letter(producer, dlq, source, 0, 200, now, dlq_partition=0)
    dead_letter(producer, dlq, source, 1, 201, now, dlq_partition=1)
    dead_letter(producer, dlq, other, 0, 300, now - 10 * HOUR_MS, dlq_partition=0)
    producer.produce(dlq, value=b"not a dead letter", partition=1, timestamp=now - 10 * HOUR_MS)
    assert producer.flush(30) == 0
    until = datetime.datetime.fromtimestamp((now - HOUR_MS) / 1000, datetime.UTC)
    return {
        "source": source,
        "dlq": dlq,
        "other": other,
        "doc": doc,
        "spec": parse_pipeline(doc),
        "until": until,
        "path": write_manifest(tmp_path / "pipeline.yaml", doc),
    }


def test_dead_letters_until_the_timestamp_go_back_to_their_partition_once(
    kafka_broker: KafkaBroker, setup: dict[str, Any]
) -> None:
    spec, source = setup["spec"], setup["source"]
    request = RedriveRequest("r1", setup["dlq"], setup["until"])
    group = redrive_group(spec.source.group_id)

    result = redrive_mod.redrive(spec, request, group)

    # Per DLQ partition: three old dead letters, then one newer than until and one record that
    # is not to be replayed (another topic's dead letter, not a dead letter): the partition stops
    # at the first newer one, and what is behind it is left for the next redrive.
    assert (result.totals.replayed, result.totals.left, result.totals.skipped) == (6, 4, 0)
    replayed = read_all(kafka_broker.bootstrap, source)
    assert sorted(m.value() for m in replayed) == [f"v{100 + i}".encode() for i in range(6)]
    for m in replayed:
        offset = int(m.value()[1:])
        assert m.key() == f"k{offset}".encode()
        assert m.partition() == (offset - 100) % 3, "back to the partition it came from"
        headers = dict(m.headers() or [])
        assert headers["trace"] == f"t{offset - 100}".encode(), "the producer's headers are kept"
        assert headers[redrive_mod.H_REDRIVE_ID] == b"r1"
        assert headers[redrive_mod.H_REDRIVE_SOURCE].startswith(setup["dlq"].encode() + b"/")
        assert not [k for k in headers if k.startswith("offtake.") and "redrive" not in k]
        assert abs(m.timestamp()[1] - time.time() * 1000) < 120_000, "stamped now, not 10 h ago"

    # The same redrive again: everything up to until is behind its position, nothing is
    # replayed twice; its totals are the group's, across runs.
    again = redrive_mod.redrive(spec, request, group)
    assert (again.totals.replayed, again.totals.left, again.totals.skipped) == (6, 4, 0)
    assert len(read_all(kafka_broker.bootstrap, source)) == 6
    config = {"bootstrap.servers": kafka_broker.bootstrap}
    progress = redrive_mod.read_progress(config, group, setup["dlq"], "r1")
    assert progress is not None
    assert (progress.totals.replayed, progress.totals.left, progress.totals.skipped) == (6, 4, 0)
    assert sum(progress.positions.values()) == 6, "held at the first dead letter after until"

    # The next redrive starts there: the two newer dead letters, none of the first six again.
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    second = redrive_mod.redrive(spec, RedriveRequest("r2", setup["dlq"], later), group)
    assert (second.totals.replayed, second.totals.left, second.totals.skipped) == (2, 0, 2)
    values = sorted(m.value() for m in read_all(kafka_broker.bootstrap, source))
    assert values == sorted([f"v{100 + i}".encode() for i in range(6)] + [b"v200", b"v201"])
    assert read_all(kafka_broker.bootstrap, setup["other"]) == [], "not this pipeline's topic"
    assert redrive_mod.read_progress(config, group, setup["dlq"], "r1") is not None


def test_a_redrive_that_crashes_resumes_without_replaying_twice(
    kafka_broker: KafkaBroker, setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, source = setup["spec"], setup["source"]
    request = RedriveRequest("crashy", setup["dlq"], setup["until"])
    group = redrive_group(spec.source.group_id)
    monkeypatch.setattr(redrive_mod, "BATCH", 1)

    class Crash(Exception):
        pass

    def crash(_result: Any) -> None:
        raise Crash  # right after the first batch's commit

    with pytest.raises(Crash):
        redrive_mod.redrive(spec, request, group, on_batch=crash)
    first = len(read_all(kafka_broker.bootstrap, source))
    assert 0 <= first < 6

    result = redrive_mod.redrive(spec, request, group)

    assert result.totals.replayed == 6
    values = [m.value() for m in read_all(kafka_broker.bootstrap, source)]
    assert sorted(values) == [f"v{100 + i}".encode() for i in range(6)], "none lost, none twice"


def test_a_replayed_record_that_fails_again_is_left_for_the_next_redrive(
    kafka_broker: KafkaBroker, setup: dict[str, Any]
) -> None:
    spec, source, dlq = setup["spec"], setup["source"], setup["dlq"]
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    request = RedriveRequest("loop", dlq, later)
    group = redrive_group(spec.source.group_id)
    first = redrive_mod.redrive(spec, request, group)
    assert first.totals.replayed == 8
    # The pipeline fails them again: the dead letters now carry this redrive's id.
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for m in read_all(kafka_broker.bootstrap, source):
        dead_letter(
            producer,
            dlq,
            source,
            m.partition(),
            m.offset(),
            int(time.time() * 1000) - 1000,
            headers=tuple(m.headers() or []),
        )
    assert producer.flush(30) == 0

    # The same redrive resumed (its Job restarted, say): not again, that could loop forever.
    second = redrive_mod.redrive(spec, request, group)

    assert (second.totals.replayed, second.totals.left, second.totals.skipped) == (8, 8, 2)
    assert len(read_all(kafka_broker.bootstrap, source)) == 8

    # The next redrive (after the next fix) takes them: they were not passed over.
    third = redrive_mod.redrive(spec, RedriveRequest("loop-2", dlq, later), group)
    assert (third.totals.replayed, third.totals.left, third.totals.skipped) == (8, 0, 0)
    assert len(read_all(kafka_broker.bootstrap, source)) == 16


def test_cli_redrives_and_prints_a_summary(
    kafka_broker: KafkaBroker, setup: dict[str, Any]
) -> None:
    until = setup["until"].strftime("%Y-%m-%dT%H:%M:%SZ")
    done = run_cli("redrive", "--pipeline", str(setup["path"]), "--until", until, "--id", "cli")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["replayed"], summary["left"], summary["skipped"]) == (6, 4, 0)
    assert summary["from"] == setup["dlq"], "--from defaults to errors.dlq.topic"
    assert summary["group"] == setup["spec"].source.group_id + ".redrive"


def test_bad_input_is_named(setup: dict[str, Any], tmp_path: Path) -> None:
    path = str(setup["path"])
    missing = run_cli(
        "redrive", "--pipeline", path, "--from", "no-such-dlq", "--until", "2026-01-01T00:00:00Z"
    )
    assert missing.returncode == 2
    assert "--from: the dead-letter topic 'no-such-dlq' does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr

    bad = run_cli("redrive", "--pipeline", path, "--until", "yesterday")
    assert bad.returncode == 2
    assert "--until: expected an RFC 3339 timestamp" in bad.stderr

    doc = dict(setup["doc"])
    doc["spec"] = {**doc["spec"], "redrive": {"id": "r", "until": "soon"}}
    invalid = run_cli("validate", str(write_manifest(tmp_path / "bad.yaml", doc)))
    assert invalid.returncode == 2
    assert "spec.redrive.until: expected an RFC 3339 timestamp" in invalid.stderr

    doc["spec"] = {k: v for k, v in doc["spec"].items() if k != "errors"}
    doc["spec"]["redrive"] = {"id": "r", "until": "2026-01-01T00:00:00Z"}
    no_dlq = run_cli("validate", str(write_manifest(tmp_path / "nodlq.yaml", doc)))
    assert no_dlq.returncode == 2
    assert "spec.redrive.from: is required" in no_dlq.stderr


# -- attacks (issue 23, item 6): what a producer writes never decides where a record goes ---


def test_forged_origin_headers_are_moved_aside_and_the_redrive_uses_the_true_source(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """A producer writes poison records carrying ``offtake.original.*`` headers that point at
    another topic the pipeline consumes; the real worker dead-letters them, and the redrive
    sends each back to the topic, partition and key it was really consumed from."""
    source, decoy, dlq = topic_factory(3), topic_factory(1), topic_factory(1)
    doc = manifest(
        "forged",
        kafka_broker.bootstrap,
        [source, decoy],
        sink={"log": {}},
        processor={"function": "support.processors:poison"},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    forged = [
        ("offtake.original.topic", decoy.encode()),
        ("offtake.original.partition", b"0"),
        ("offtake.original.offset", b"0"),
        ("offtake.attempts", b"99999999999999999999"),
        ("trace", b"kept"),
    ]
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(6):
        value = json.dumps({"id": i, "poison": True}).encode()
        producer.produce(source, value, key=f"k{i}".encode(), partition=i % 3, headers=forged)
    assert producer.flush(30) == 0
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], source, 3, 60)
    assert worker.terminate() == 0, worker.output()[-2000:]

    dead = read_all(kafka_broker.bootstrap, dlq)
    assert len(dead) == 6
    for m in dead:
        names = [k for k, _ in m.headers()]
        headers = dict(m.headers())
        for name in ("offtake.original.topic", "offtake.original.partition", "offtake.attempts"):
            assert names.count(name) == 1, f"exactly one {name}, Offtake's"
        assert headers["offtake.original.topic"] == source.encode()
        assert headers["offtake.attempts"] == b"1"
        assert headers["producer.offtake.original.topic"] == decoy.encode(), "moved aside, kept"
        assert headers["trace"] == b"kept"

    spec = parse_pipeline(doc)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    result = redrive_mod.redrive(
        spec, RedriveRequest("true-source", dlq, later), redrive_group(spec.source.group_id)
    )

    assert (result.totals.replayed, result.totals.rejected) == (6, 0)
    assert read_all(kafka_broker.bootstrap, decoy) == [], "nothing went where the headers lied"
    replayed = [m for m in read_all(kafka_broker.bootstrap, source) if m.offset() >= 2]
    assert sorted(m.key() for m in replayed) == [f"k{i}".encode() for i in range(6)]
    for m in replayed:
        assert m.partition() == int(m.key()[1:]) % 3, "back to the partition it came from"
        assert dict(m.headers())["trace"] == b"kept"


def test_a_crafted_partition_header_fails_that_dead_letter_alone(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """Dead letters whose ``offtake.original.partition`` was crafted (written straight into the
    DLQ) are rejected one by one, each named with the header and where it sits; the other dead
    letters are replayed and ``offtake redrive`` (the Job's command) exits 0."""
    source, dlq = topic_factory(3), topic_factory(1)
    doc = manifest(
        "crafted",
        kafka_broker.bootstrap,
        [source],
        sink={"log": {}},
        errors={"policy": "dlq", "dlq": {"topic": dlq}},
    )
    crafted = [b"99999999999", b"-1", b"\xff", "\u00b2".encode(), b"7"]
    old = int(time.time() * 1000) - HOUR_MS
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(8):  # good dead letters at DLQ offsets 0..7
        dead_letter(producer, dlq, source, i % 3, 100 + i, old)
    assert producer.flush(30) == 0
    bad_at = {1: crafted[0], 3: crafted[1], 5: crafted[2], 6: crafted[3], 7: crafted[4]}
    bad = [m for m in read_all(kafka_broker.bootstrap, dlq) if m.offset() in bad_at]
    for m in bad:  # the same records again, partition header crafted, at new offsets 8..12
        headers = [(k, bad_at[m.offset()] if k == H_PARTITION else v) for k, v in m.headers()]
        producer.produce(dlq, m.value(), key=m.key(), headers=headers, timestamp=old)
    assert producer.flush(30) == 0
    path = write_manifest(tmp_path / "p.yaml", doc)
    until = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    done = run_cli("redrive", "--pipeline", str(path), "--until", until, "--id", "crafted")

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["replayed"], summary["rejected"], summary["left"]) == (8, 5, 0)
    for offset, raw in zip(range(8, 13), bad_at.values(), strict=True):
        where = f"{dlq}/0/{offset}: header offtake.original.partition: "
        reason = next(r for r in summary["rejections"] if r.startswith(where))
        out_of_range = f"7 is not a partition of {source} (3 partitions)"
        assert f"got {raw!r}" in reason or (raw == b"7" and reason.endswith(out_of_range))
        assert f"dead letter {dlq}/0/{offset} not replayed" in done.stderr
    assert "7 is not a partition of" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(read_all(kafka_broker.bootstrap, source)) == 8, "the good ones, once"
    progress = redrive_mod.read_progress(
        {"bootstrap.servers": kafka_broker.bootstrap},
        redrive_group(parse_pipeline(doc).source.group_id),
        dlq,
        "crafted",
    )
    assert progress is not None and progress.totals.rejected == 5
    assert progress.positions == {0: 13}, "passed over (still in the DLQ), never blocking"
