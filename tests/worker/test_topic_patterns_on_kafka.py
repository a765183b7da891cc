"""source.topics with a pattern (``^orders\\..*``) on the real broker: the worker subscribes by
regular expression and reads every matching topic (and no other), and the operator's lag and
rewind find the topics the pattern matches."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from support.workers import WorkerProcess, manifest, produce, read_all, write_manifest

from offtake.config import parse_pipeline
from offtake_operator.group_offsets import reset_offsets
from offtake_operator.lag import measure_lag
from offtake_operator.operator_spec import Rewind
from offtake_testbed.kafka import KafkaBroker


def test_a_pattern_reads_both_matching_topics_and_lag_and_rewind_cover_them(
    kafka_broker: KafkaBroker, topic_factory: Any, tmp_path: Path
) -> None:
    stem = f"pat{uuid.uuid4().hex[:8]}"
    first, second = (
        topic_factory(2, prefix=f"{stem}.orders"),
        topic_factory(prefix=f"{stem}.orders"),
    )
    other, out = topic_factory(prefix=f"{stem}.payments"), topic_factory()
    pattern = f"^{re.escape(stem)}\\.orders-.*"
    produce(kafka_broker.bootstrap, first, ({"id": i} for i in range(300)))
    produce(kafka_broker.bootstrap, second, ({"id": i} for i in range(1000, 1200)))
    produce(kafka_broker.bootstrap, other, ({"id": i} for i in range(5000, 5050)))
    doc = manifest("patterns", kafka_broker.bootstrap, [pattern], sink={"kafka": {"topic": out}})
    worker = WorkerProcess(write_manifest(tmp_path / "p.yaml", doc), tmp_path / "w.log").start()
    worker.wait_until(lambda: len(read_all(kafka_broker.bootstrap, out)) >= 500, "500 records")
    pipeline = parse_pipeline(doc)
    # Everything delivered is committed by the graceful stop.
    assert worker.terminate() == 0, worker.output()[-3000:]
    ids = sorted(json.loads(m.value())["id"] for m in read_all(kafka_broker.bootstrap, out))
    assert ids == [*range(300), *range(1000, 1200)]  # both matching topics, not the third

    caught_up = measure_lag(pipeline, {}, timeout=10)
    assert (caught_up.lag, caught_up.partitions) == (0, 3)  # 2 + 1 partitions matched
    produce(kafka_broker.bootstrap, second, ({"id": i} for i in range(2000, 2010)))
    assert measure_lag(pipeline, {}, timeout=10).lag == 10

    offsets = reset_offsets(pipeline, {}, Rewind(id="r1", to="earliest"), 10)
    assert offsets == {(first, 0): 0, (first, 1): 0, (second, 0): 0}
    assert measure_lag(pipeline, {}, timeout=10).lag == 510
