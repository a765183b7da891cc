"""Phase, conditions and Events from what a reconcile observed."""

from __future__ import annotations

from typing import Any

from offtake_operator.status import (
    LAG_SECONDS_FLOOR,
    LAG_SECONDS_STEP,
    Event,
    Observed,
    changed,
    compute_status,
    deployment_counts,
    lag_changed,
)


def dep(replicas: int, ready: int, updated: int | None = None, **extra: Any) -> dict[str, Any]:
    status = {
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": replicas if updated is None else updated,
    }
    status.update(extra)
    return {"metadata": {"generation": 2}, "status": {"observedGeneration": 2, **status}}


def cond(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return dict(next(c for c in status["conditions"] if c["type"] == ctype))


def test_all_ready_is_running() -> None:
    status, events = compute_status({}, Observed("p", 3, 2, deployment=dep(2, 2)), now="T1")
    assert status["phase"] == "Running"
    assert status["observedGeneration"] == 3
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert status["selector"] == "offtake.dev/pipeline=p"
    assert (
        cond(status, "Ready").items()
        >= {
            "status": "True",
            "reason": "WorkersReady",
            "lastTransitionTime": "T1",
        }.items()
    )
    assert cond(status, "Progressing")["status"] == "False"
    assert cond(status, "Degraded")["status"] == "False"
    assert events == [Event("Normal", "Running", "2/2 workers ready")]


def test_transition_times_are_kept_while_nothing_changes() -> None:
    first, _ = compute_status({}, Observed("p", 1, 2, deployment=dep(2, 2)), now="T1")
    second, events = compute_status(first, Observed("p", 1, 2, deployment=dep(2, 2)), now="T2")
    assert second == first
    assert events == []
    assert not changed(first, second)


def test_not_ready_yet_is_pending_then_rolling_is_progressing() -> None:
    status, _ = compute_status({}, Observed("p", 1, 2, deployment=dep(2, 0)))
    assert status["phase"] == "Pending"
    assert cond(status, "Ready")["reason"] == "WorkersNotReady"
    rolling, _ = compute_status({}, Observed("p", 1, 2, deployment=dep(3, 2, updated=1)))
    assert rolling["phase"] == "Running"  # enough workers ready while the rollout goes on
    assert (
        cond(rolling, "Progressing").items() >= {"status": "True", "reason": "RollingOut"}.items()
    )


def test_paused() -> None:
    status, events = compute_status(
        {"phase": "Running"}, Observed("p", 1, 0, paused=True, deployment=dep(0, 0))
    )
    assert status["phase"] == "Paused"
    assert cond(status, "Ready")["reason"] == "Paused"
    assert events == [Event("Normal", "Paused", "0/0 workers ready")]


def test_invalid_spec_is_degraded_with_the_loaders_message_once() -> None:
    seen = Observed("p", 4, 2, deployment=dep(2, 2), invalid="spec.x: unknown field")
    status, events = compute_status({"phase": "Running"}, seen)
    assert status["phase"] == "Degraded"
    degraded = cond(status, "Degraded")
    assert (
        degraded.items()
        >= {
            "status": "True",
            "reason": "InvalidSpec",
            "message": "spec.x: unknown field",
        }.items()
    )
    assert status["message"] == "spec.x: unknown field"
    assert events == [Event("Warning", "InvalidSpec", "spec.x: unknown field")]
    # The workers still run the previous spec: Ready says so.
    assert cond(status, "Ready")["status"] == "True"
    _, again = compute_status(status, seen)
    assert again == []  # no Event storm on every resync
    _, other = compute_status(
        status, Observed("p", 5, 2, deployment=dep(2, 2), invalid="spec.y: bad")
    )
    assert other == [Event("Warning", "InvalidSpec", "spec.y: bad")]


def test_rejected_child_is_failed_and_stuck_rollout_is_degraded() -> None:
    failed, events = compute_status(
        {}, Observed("p", 1, 2, failed="Deployment p was rejected: Invalid: image")
    )
    assert failed["phase"] == "Failed"
    assert cond(failed, "Degraded")["reason"] == "ChildRejected"
    assert events[0].type == "Warning"
    # Paused or not, nothing of the spec was applied: Failed, and not Ready, saying why.
    paused, _ = compute_status(
        {}, Observed("p", 1, 0, paused=True, failed="Deployment p was rejected by ...")
    )
    assert paused["phase"] == "Failed"
    ready = cond(paused, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChildRejected")
    assert ready["message"] == "Deployment p was rejected by ..."
    # A pass that applies them clears it.
    cleared, _ = compute_status(paused, Observed("p", 2, 0, paused=True))
    assert cleared["phase"] == "Paused"
    assert cond(cleared, "Ready")["reason"] == "Paused"
    assert cond(cleared, "Degraded")["status"] == "False"
    stuck = dep(
        2,
        1,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": "ReplicaSet p-1 has timed out progressing.",
            }
        ],
    )
    status, _ = compute_status({}, Observed("p", 1, 2, deployment=stuck))
    assert status["phase"] == "Degraded"
    assert cond(status, "Degraded")["message"] == "ReplicaSet p-1 has timed out progressing."


def test_rewinding_is_pending_and_progressing() -> None:
    status, _ = compute_status(
        {}, Observed("p", 1, 0, deployment=dep(0, 0), rewinding="rewind r1: waiting")
    )
    assert status["phase"] == "Pending"
    assert cond(status, "Progressing").items() >= {"status": "True", "reason": "Rewinding"}.items()
    assert cond(status, "Ready")["reason"] == "Rewinding"


def test_counts_without_a_deployment() -> None:
    counts = deployment_counts(None)
    assert (counts.replicas, counts.ready, counts.updated) == (0, 0, 0)


def test_changed_understands_merge_patch_deletes() -> None:
    old = {"rewind": {"lastId": "a", "activeId": "b"}, "lag": 1}
    assert not changed(old, {"lag": 1})
    assert not changed(old, {"rewind": {"activeId": "b"}})
    assert changed(old, {"rewind": {"activeId": None}})
    assert not changed({"rewind": {"lastId": "a"}}, {"rewind": {"activeId": None}})
    assert changed(old, {"lag": 2})


def test_lag_is_written_when_the_messages_move_and_its_age_by_a_step() -> None:
    """A backlog that nothing consumes only ages: its lagSeconds is not rewritten at every
    measurement, only when it has moved by a step (LAG_SECONDS_STEP of the value written)."""
    written = {"lag": 1200, "lagSeconds": 200.0, "partitions": 6}
    aged = {**written, "lagSeconds": 200.0 * (1 + LAG_SECONDS_STEP) - 1}
    assert not lag_changed(written, aged)
    assert lag_changed(written, {**written, "lagSeconds": 200.0 * (1 + LAG_SECONDS_STEP)})
    assert lag_changed(written, {**written, "lagSeconds": 200.0 * (1 - LAG_SECONDS_STEP)})
    # The lag in messages and the partitions are written whenever they change, and the age
    # with them: caught up is lag 0 and 0 s at once.
    assert lag_changed(written, {**aged, "lag": 1199})
    assert lag_changed(written, {"lag": 0, "lagSeconds": 0.0, "partitions": 6})
    assert lag_changed(written, {**aged, "partitions": 7})
    # Small ages move by at least LAG_SECONDS_FLOOR; the first measurement is always written.
    small = {"lag": 3, "lagSeconds": 0.5, "partitions": 6}
    assert not lag_changed(small, {**small, "lagSeconds": 0.5 + LAG_SECONDS_FLOOR / 2})
    assert lag_changed(small, {**small, "lagSeconds": 0.5 + LAG_SECONDS_FLOOR})
    assert lag_changed({}, small)
    # Queue mode: no lag at all removes the figures written before, and adds nothing after.
    share = {"lag": None, "lagSeconds": None, "partitions": 6}
    assert lag_changed(written, share)
    assert not lag_changed({"partitions": 6}, share)
