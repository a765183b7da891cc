"""``kubectl offtake status`` from the workers' metrics alone (Kafka out of reach from the
terminal) and the SLO burn's arithmetic, on a scrape as worker_metrics parses it. The same
paths on the real API server, worker and broker: tests/e2e/test_kubectl_plugin.py."""

from __future__ import annotations

from prometheus_client import generate_latest

from offtake.metrics import Metrics
from offtake.records import TopicPartition
from offtake_operator.kubectl import status_view, worker_metrics


def scrape_of(pods: dict[str, Metrics]) -> worker_metrics.Scrape:
    out = worker_metrics.Scrape()
    for pod, metrics in pods.items():
        worker_metrics._add(out, pod, generate_latest(metrics.registry).decode())
        out.read.append(pod)
    return out


def test_without_kafka_the_workers_own_lag_fills_the_partition_table() -> None:
    a, b = Metrics("p"), Metrics("p")
    a.set_lag(TopicPartition("orders", 0), 120, 35.5)
    a.set_lag_trend(TopicPartition("orders", 0), 4.25)
    b.set_lag(TopicPartition("orders", 1), 0, 0.0)
    b.set_lag_trend(TopicPartition("orders", 1), -0.001)
    scraped = scrape_of({"w-a": a, "w-b": b})
    rows = status_view._rows_from_metrics(scraped)
    assert rows == [
        {"topic": "orders", "partition": 0, "owner": "w-a", "committed": None, "logEnd": None,
         "lag": 120, "lagSeconds": 35.5, "trend": 4.25},
        {"topic": "orders", "partition": 1, "owner": "w-b", "committed": None, "logEnd": None,
         "lag": 0, "lagSeconds": 0.0, "trend": 0.0},
    ]  # fmt: skip
    report = {
        "name": "p", "namespace": "shop", "phase": "Running", "reason": "WorkersReady",
        "message": "", "replicas": {"desired": 2, "running": 2, "ready": 2}, "conditions": [],
        "lag": {"records": None, "seconds": None, "from": "status"}, "partitions": rows,
        "pods": [], "metrics": {"read": scraped.read, "unreadable": {}}, "dlq": None,
        "redrive": None, "events": [], "slo": None,
    }  # fmt: skip
    text = status_view.render(report, "Kafka at k:9092 is not reachable from here (...)")
    assert "per-partition lag: the workers' own lag is shown" in text
    lines = text.splitlines()
    assert lines[lines.index(next(x for x in lines if x.startswith("TOPIC"))) + 1].split() == [
        "orders", "0", "w-a", "-", "-", "120", "35.5", "+4.2/s",
    ]  # fmt: skip


def test_slo_burn_is_consumption_over_allowance_and_says_what_it_could_not_read() -> None:
    m = Metrics("p")
    m.init_topics(["orders"])
    for outcome, n in (("delivered", 90), ("dlq", 4), ("skipped", 1), ("retried", 30)):
        m.processed.labels("orders", outcome).inc(n)
    slo = {"maxLagSeconds": 20, "maxErrorRatio": 0.02, "maxTimeSinceLastCommitSeconds": 60}
    burn = status_view.slo_burn(slo, 30.0, scrape_of({"w": m}))
    assert burn is not None
    assert (burn["lag"]["burn"], burn["lag"]["observedSeconds"]) == (1.5, 30.0)
    # 5 of 95 done (retried records are not done yet): 0.0526 over 0.02.
    errors = {k: burn["errors"][k] for k in ("errors", "done", "ratio", "burn")}
    assert errors == {"errors": 5, "done": 95, "ratio": 0.052632, "burn": 2.63}
    assert burn["commits"]["burn"] is None
    unread = status_view.slo_burn(slo, None, worker_metrics.Scrape())
    assert unread is not None
    assert unread["errors"]["burn"] is None and unread["lag"]["burn"] is None
    assert unread["errors"]["basis"].startswith("not read")
    assert status_view.slo_burn(None, 3.0, worker_metrics.Scrape()) is None
    shown = status_view._render_slo(unread)
    assert "  errors          -  no metrics, budget 0.02" in shown


def test_a_share_group_pipeline_says_it_runs_in_queue_mode_and_why_it_shows_no_lag() -> None:
    """Queue mode: no lag (a share group has no committed offsets; the operator's status
    leaves it out too), the reason, and the age of records when the workers acquired them."""
    a, b = Metrics("q"), Metrics("q")
    a.lag_seconds.labels("jobs", "0").set(12.25)  # the queue policy's export: age, no count
    b.lag_seconds.labels("jobs", "1").set(3.0)
    lag = status_view.queue_mode_lag(scrape_of({"w-a": a, "w-b": b}))
    assert (lag["records"], lag["seconds"], lag["acquiredAgeSeconds"]) == (None, None, 12.2)
    report = {
        "name": "q", "namespace": "shop", "phase": "Running", "reason": "WorkersReady",
        "message": "", "groupType": "share",
        "replicas": {"desired": 6, "running": 6, "ready": 6}, "conditions": [],
        "lag": lag, "partitions": None,
        "pods": [], "metrics": {"read": [], "unreadable": {}}, "dlq": None,
        "redrive": None, "events": [], "slo": None,
    }  # fmt: skip
    text = status_view.render(report, None)
    assert "workers: 6/6 ready, 6 running; queue mode (share group" in text
    assert "lag: n/a in queue mode: a share group commits no offsets" in text
    assert "records were 12.2 s old when the workers acquired them" in text
    assert "TOPIC" not in text  # no partition table of offsets it does not have
    consumer = {**report, "groupType": "consumer", "lag": {"records": 5, "seconds": 1.0,
                "from": "status"}}  # fmt: skip
    assert "queue mode" not in status_view.render(consumer, None)
    unread = status_view.queue_mode_lag(worker_metrics.Scrape())
    assert unread["acquiredAgeSeconds"] is None


def test_queue_mode_shows_the_backlog_as_an_estimate_with_what_it_leaves_out() -> None:
    """issue 39 item 3: per partition the least backlog any worker reports (the one furthest
    ahead knows the frontier best), summed; marked as an estimate."""
    a, b = Metrics("q"), Metrics("q")
    a.share_backlog.labels("jobs", "0").set(700)  # behind: it acquired from p0 a while ago
    b.share_backlog.labels("jobs", "0").set(450)
    b.share_backlog.labels("jobs", "1").set(30)
    lag = status_view.queue_mode_lag(scrape_of({"w-a": a, "w-b": b}))
    backlog = lag["backlog"]
    assert (backlog["records"], backlog["partitions"], backlog["estimate"]) == (480, 2, True)
    report = {
        "name": "q", "namespace": "shop", "phase": "Running", "reason": "WorkersReady",
        "message": "", "groupType": "share",
        "replicas": {"desired": 2, "running": 2, "ready": 2}, "conditions": [],
        "lag": lag, "partitions": None,
        "pods": [], "metrics": {"read": [], "unreadable": {}}, "dlq": None,
        "redrive": None, "events": [], "slo": None,
    }  # fmt: skip
    text = status_view.render(report, None)
    assert "backlog (an estimate): 480 records past the acquisition frontier in 2 partition" in text
    assert "leaves out released records" in text
    assert status_view.queue_mode_lag(worker_metrics.Scrape())["backlog"]["records"] is None


def test_with_concurrency_status_shows_calls_in_flight_records_waiting_and_the_oldest_call() -> (
    None
):
    """processor.concurrency above 1: the workers' calls gauges, summed (the oldest call: the
    worst worker's), each worker's own on a line; nothing at concurrency 1."""
    a, b = Metrics("c"), Metrics("c")
    a.calls_in_flight.set(64)
    a.records_waiting.set(310)
    a.oldest_call_seconds.set(2.04)
    b.calls_in_flight.set(12)
    b.oldest_call_seconds.set(0.25)
    scraped = scrape_of({"w-a": a, "w-b": b})
    calls = status_view.calls({"concurrency": 64, "order": "key"}, scraped)
    assert calls is not None
    assert {k: calls[k] for k in ("inFlight", "waiting", "oldestSeconds")} == {
        "inFlight": 76,
        "waiting": 310,
        "oldestSeconds": 2.0,
    }
    assert calls["pods"]["w-b"] == {"inFlight": 12, "waiting": 0, "oldestSeconds": 0.2}
    shown = status_view._render_calls(calls)
    assert shown[0] == (
        "calls (processor.concurrency 64, order key): 76 in flight, 310 records waiting behind "
        "a busy key, oldest call 2.0 s (from the workers' /metrics)"
    )
    assert shown[1].split() == ["w-a", "64", "in", "flight", "310", "waiting", "oldest", "2.0", "s"]
    # Unread metrics: the numbers are unknown, not 0.
    unread = status_view.calls({"concurrency": 8, "order": "partition"}, worker_metrics.Scrape())
    assert unread is not None and unread["inFlight"] is None and unread["pods"] == {}
    assert (
        "- in flight, - records waiting behind a busy partition"
        in (status_view._render_calls(unread)[0])
    )
    for one_at_a_time in (None, {}, {"concurrency": 1, "order": "key"}):
        assert status_view.calls(one_at_a_time, scraped) is None
    assert status_view._render_calls(None) == []
