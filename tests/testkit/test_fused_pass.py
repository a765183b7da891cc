"""engine/fused.py: a Work's records decoded, called and made sink items in one pass, and
what the pass hands to the general path (a record the fast decoder refuses, a call that
raised, dropped, fanned out to none or returned an awaitable), on the real engine and the
memory broker. The outputs must be what the general path makes: in offset order, each rule
(dead letter, retry, drop, strict ordering) applied to its record only."""

from __future__ import annotations

from typing import Any

import pytest

from offtake.engine.fused import FusedPass
from offtake.records import Record
from offtake.testing import MemoryBroker, PipelineHarness, run_pipeline

KINDS = ["ok", "raise", "drop", "empty", "fan", "await", "flaky", "ok"]
BAD = 12  # not JSON: the careful decoder says why, then the dead-letter topic


def manifest(ordering: str) -> dict[str, Any]:
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "fused", "namespace": "t"},
        "spec": {
            "kafka": {"bootstrapServers": "unused:9092"},
            "source": {"topics": ["in"], "groupId": "g", "format": "json"},
            "sink": {"kafka": {"topic": "out"}},
            "commit": {"intervalSeconds": 0.05},
            "errors": {
                "policy": "dlq",
                "dlq": {"topic": "in-dlq"},
                "maxRetries": 2,
                "retryBackoffSeconds": 0.01,
                "ordering": ordering,
            },
        },
    }


async def _later(value: Any) -> Any:
    return value


def mixed(seen: dict[int, int]) -> Any:
    def function(record: Record) -> Any:
        v = record.value
        seen[v["id"]] = seen.get(v["id"], 0) + 1
        kind = v["kind"]
        if kind == "raise":
            raise ValueError(f"bad {v['id']}")
        if kind == "flaky" and seen[v["id"]] == 1:
            raise RuntimeError("once")  # retried: the second attempt succeeds
        if kind == "drop":
            return None
        if kind == "empty":
            return []
        if kind == "fan":
            return [v, v]
        if kind == "await":
            return _later(v)
        return v

    return function


def filled() -> MemoryBroker:
    """A broker whose topic "in" holds 3 x KINDS records, ``BAD`` among them not JSON."""
    broker = MemoryBroker()
    broker.create_topic("in", 1)
    for i in range(3 * len(KINDS)):
        if i == BAD:
            broker.produce("in", b"{not json", key=str(i))  # the careful decoder's, then the DLQ
        else:
            broker.produce("in", {"id": i, "kind": KINDS[i % len(KINDS)]}, key=str(i))
    return broker


@pytest.mark.parametrize("ordering", ["relaxed", "strict"])
def test_each_record_gets_the_general_paths_outcome_in_offset_order(ordering: str) -> None:
    broker = filled()
    n = 3 * len(KINDS)
    seen: dict[int, int] = {}
    run = run_pipeline(manifest(ordering), broker, processor=mixed(seen), timeout=30)
    assert run.ok
    expected: list[int] = []
    flaky_done: list[int] = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if i == BAD or kind in ("raise", "drop", "empty"):
            continue
        if kind == "flaky":
            flaky_done.append(i)
            if ordering == "relaxed":
                continue  # it comes out after its retry: its neighbours go on meanwhile
        expected.extend([i, i] if kind == "fan" else [i])
    got = [o["id"] for o in run.outputs]
    if ordering == "relaxed":
        assert sorted(got) == sorted(expected + flaky_done)
        assert [i for i in got if i not in flaky_done] == expected
    else:
        assert got == expected  # strict: the ones behind a retried record wait behind it
    dead = sorted(int(m.key()) for m in run.dlq)
    assert dead == sorted([BAD, *(i for i in range(n) if KINDS[i % len(KINDS)] == "raise")])

    # Called once per attempt, never more: a failing record three times (maxRetries 2).
    def attempts(i: int) -> int:
        return 3 if KINDS[i % len(KINDS)] == "raise" else 2 if i in flaky_done else 1

    assert seen == {i: attempts(i) for i in seen} and BAD not in seen


def test_queue_modes_first_deliveries_take_the_pass_and_redeliveries_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queue mode numbers attempts from the broker's delivery count: a poll of first
    deliveries starts every record at 1 and takes the pass; a redelivered record (released
    after a failure) takes the general path, which counts its attempt. The outcomes are the
    same rules' (queue mode keeps no order: compared as sets)."""
    passes: list[int] = []  # the records of each Work that took the pass
    run = FusedPass.run

    def spy(self: FusedPass, work: Any, *args: Any) -> None:
        passes.append(len(work.messages))
        run(self, work, *args)

    monkeypatch.setattr(FusedPass, "run", spy)
    broker = filled()
    n = 3 * len(KINDS)
    doc = manifest("relaxed")
    doc["spec"]["source"]["groupType"] = "share"
    doc["spec"]["errors"]["retryBackoffSeconds"] = 0
    kinds = {i: KINDS[i % len(KINDS)] for i in range(n) if i != BAD}
    expected = sorted(
        j
        for i, k in kinds.items()
        if k not in ("raise", "drop", "empty")
        for j in ([i, i] if k == "fan" else [i])
    )
    dead = sorted([BAD, *(i for i, k in kinds.items() if k == "raise")])
    seen: dict[int, int] = {}
    with PipelineHarness(doc, broker, processor=mixed(seen)) as h:
        h.add_worker()
        h.wait_until(lambda: len(h.outputs()) == len(expected) and len(h.dlq()) == len(dead))
        assert h.stop_all() == [0]
    assert sorted(o["id"] for o in h.outputs()) == expected
    assert sorted(int(m.key()) for m in h.dlq()) == dead
    assert passes, "no poll took the one pass"
    # Attempts counted by deliveries: a failing record three times (maxRetries 2), a flaky one
    # twice, the others once.
    assert seen == {i: 3 if k == "raise" else 2 if k == "flaky" else 1 for i, k in kinds.items()}
