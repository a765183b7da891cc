"""The bench's anchor, the careful hand-written loop (bench/bench_contenders.py ``loop``), on the
test bed's Kafka: what the bench's ratios are measured against must itself be right.

Its JSON output is the shared workload's (bench_workloads.enrich) written by orjson, every
input record is there once, and after SIGTERM its group's committed offsets are at the input's
end: the asynchronous commits landed, and the last batch's by the final synchronous one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from support.workers import committed, end_offsets, read_all

from offtake_testbed.kafka import KafkaBroker

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_workloads  # noqa: E402  (standard library only, like the contenders' code)
from passthrough import fill, record_value  # noqa: E402

RECORDS = 3_000


def test_the_careful_loop_enriches_every_record_once_and_commits_to_the_end(
    kafka_broker: KafkaBroker, topic_factory: Any
) -> None:
    src, out = topic_factory(4), topic_factory(1)
    fill(kafka_broker.bootstrap, src, RECORDS)
    group = f"loop-{uuid.uuid4().hex[:8]}"
    loop = subprocess.Popen(
        [
            sys.executable,
            str(BENCH / "bench_contenders.py"),
            "loop",
            *("--bootstrap", kafka_broker.bootstrap, "--input", src, "--output", out),
            *("--group", group, "--workload", "json"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while end_offsets(kafka_broker.bootstrap, out, 1)[0] < RECORDS:
            assert loop.poll() is None, loop.communicate()[1]
            assert time.monotonic() < deadline, "the loop did not forward every record"
            time.sleep(0.2)
        loop.send_signal(signal.SIGTERM)
        _, err = loop.communicate(timeout=30)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    assert loop.returncode == 0, err
    assert "final commit failed" not in err, err
    messages = read_all(kafka_broker.bootstrap, out)
    assert sorted(int(m.key()) for m in messages) == list(range(RECORDS)), "every record once"
    by_key = {int(m.key()): m.value() for m in messages}
    # Byte for byte what orjson writes for the shared workload's result (compact, in order).
    expected = bench_workloads.enrich(json.loads(record_value(7)))
    assert by_key[7] == json.dumps(expected, separators=(",", ":")).encode()
    positions = committed(kafka_broker.bootstrap, group, src, 4)
    assert positions == end_offsets(kafka_broker.bootstrap, src, 4), positions
