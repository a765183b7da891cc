"""A tenant's broker is the attacker: it answers the operator's first request with a frame
announcing 900 MB (the tenant's config allowing 1 GB). The operator's clients (their
receive.message.max.bytes capped by the operator) drop the connection instead of reading it,
the lag read ends within its timeout with an error, and the operator's memory stays bounded.
Without the cap this process is aborted (measured: "Fatal Python error: Aborted").

Or it says nothing at all (a silent broker): its pipelines' lag round gives up at its
deadline, the other tenants' lag is measured without waiting for it, and the pipeline's
status (status.operatorClients, on the real control plane) says why its lag is missing and
which of the tenant's values the operator's clients overrode; ``kubectl offtake status``
shows both.

The server below is not a stand-in for Kafka: it speaks just enough of the protocol (read a
length-prefixed request, answer with its correlation id) to be a hostile broker."""

from __future__ import annotations

import dataclasses
import io
import resource
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from support.kube import consumer_pipeline, get, operator_running, wait_for
from support.manifest_corpus import minimal

from offtake.config import PipelineSpec, parse_pipeline
from offtake_operator import lag
from offtake_operator.context import OperatorContext
from offtake_operator.kubectl import cli
from offtake_operator.lag import KafkaAccessError, LagReport, measure_lags
from offtake_operator.settings import OperatorConfig
from offtake_testbed.kube import ControlPlane
from offtake_testbed.pytest_plugin import TopicFactory
from offtake_testbed.pytest_plugin_kube import Kubectl

CRD = Path(__file__).resolve().parents[2] / "crds" / "consumerpipeline.yaml"

#: Below the tenant's receive.message.max.bytes (so only the operator's cap stands in the way)
#: and far above that cap.
HUGE = 900_000_000
TENANTS_LIMIT = "1000000000"


def _serve(server: socket.socket, stop: threading.Event, answered: list[int]) -> None:
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            try:
                size = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))[0]
                request = conn.recv(size, socket.MSG_WAITALL)
                correlation = request[4:8]  # api_key(2) api_version(2) correlation_id(4)
                # The length prefix promises HUGE bytes; send a little of them and keep going
                # while the client reads (it should hang up first).
                conn.sendall(struct.pack(">i", HUGE) + correlation + b"\0" * 65536)
                answered.append(size)
                while not stop.is_set():
                    conn.sendall(b"\0" * 65536)
            except OSError:
                continue


@pytest.fixture
def hostile_broker() -> Iterator[tuple[str, list[int]]]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    answered: list[int] = []
    thread = threading.Thread(target=_serve, args=(server, stop, answered), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", answered
    finally:
        stop.set()
        thread.join(10)
        server.close()


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def test_a_broker_announcing_a_huge_frame_neither_exhausts_nor_stalls_the_operator(
    hostile_broker: tuple[str, list[int]],
) -> None:
    address, answered = hostile_broker
    spec = parse_pipeline(minimal())
    spec = dataclasses.replace(
        spec,
        kafka=dataclasses.replace(
            spec.kafka,
            bootstrap_servers=address,
            config={**spec.kafka.config, "receive.message.max.bytes": TENANTS_LIMIT},
        ),
    )
    before = _max_rss_mib()
    (report,) = measure_lags([(spec, {})], timeout=3)
    grown = _max_rss_mib() - before
    assert answered, "the operator's client never reached the hostile broker"
    assert isinstance(report, KafkaAccessError), report
    assert str(report), "the error says nothing"
    # A client that believed the prefix would fill a 900 MB buffer as the bytes stream in;
    # the cap keeps it to the operator's 4 MiB responses (and librdkafka's own buffers).
    assert grown < 256, f"max RSS grew by {grown:.0f} MiB"


# ------------------------------------------------------------------ a silent broker, a deadline


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """Accepts connections, reads what it is sent, answers nothing (until the test ends)."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        for conn in held:
            conn.close()
        server.close()


def _pipeline(bootstrap: str, topic: str = "orders", **config: str) -> PipelineSpec:
    spec = parse_pipeline(minimal())
    return dataclasses.replace(
        spec,
        kafka=dataclasses.replace(
            spec.kafka, bootstrap_servers=bootstrap, config={**spec.kafka.config, **config}
        ),
        source=dataclasses.replace(
            spec.source, topics=(topic,), group_id=f"g-{uuid.uuid4().hex[:6]}"
        ),
    )


def test_a_silent_broker_costs_its_own_pipelines_a_round_not_the_other_tenants(
    silent_broker: str, kafka_broker: Any, topic_factory: TopicFactory
) -> None:
    """One round gives up on the silent brokers at its deadline (their calls would wait the
    whole timeout); while their requests are still out, the next round measures the healthy
    cluster and answers without waiting for them (the silent cluster is still in flight when
    it returns), and says so for the silent one instead of starting another thread."""
    silent = _pipeline(silent_broker)
    first = measure_lags([(silent, {})], timeout=60, deadline=1)
    assert isinstance(first[0], KafkaAccessError), first
    assert "lag round gave up after 1s" in str(first[0]) and silent_broker in str(first[0])

    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for _ in range(3):
        producer.produce(topic, b"{}")
    assert producer.flush(30) == 0
    healthy = _pipeline(kafka_broker.bootstrap, topic)
    second = measure_lags([(silent, {}), (healthy, {})], timeout=60)
    silent_key = lag._config_key(lag.admin_config(silent, {}, 60))
    assert silent_key in lag._IN_FLIGHT, "the round waited for the silent brokers' timeout"
    assert isinstance(second[0], KafkaAccessError)
    assert "have not answered an earlier lag round yet" in str(second[0]), second[0]
    assert isinstance(second[1], LagReport) and second[1].lag == 3, second[1]


# ---------------------------------------------- status.operatorClients on the real control plane


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[OperatorContext]:
    control_plane.kubectl("apply", "-f", str(CRD))

    def established() -> bool:
        crd = get(control_plane.kubectl, "crd", "consumerpipelines.offtake.dev")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=60, what="the ConsumerPipeline CRD established")
    config = OperatorConfig(
        worker_image="offtake:e2e",
        resync_seconds=3,
        lag_interval_seconds=1,
        kafka_timeout_seconds=2,
    )
    with operator_running(control_plane, config) as ctx:
        yield ctx


def _operator_clients(kubectl: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return dict(
        (get(kubectl, "cpl", name, "-n", ns).get("status") or {}).get("operatorClients") or {}
    )


def _status_text(control_plane: ControlPlane, ns: str, name: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    cli.main(
        ["status", name, "--kubeconfig", str(control_plane.kubeconfig), "-n", ns], out=out, err=err
    )
    return out.getvalue() + err.getvalue()


@pytest.mark.timeout(300)
def test_the_status_says_why_lag_is_missing_and_which_tenant_values_were_overridden(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    kube_namespace: str,
    operator: OperatorContext,
    silent_broker: str,
) -> None:
    ns = kube_namespace
    bounded = consumer_pipeline(
        "bounded",
        {
            "kafka": {
                "bootstrapServers": silent_broker,
                "config": {
                    "receive.message.max.bytes": TENANTS_LIMIT,
                    "socket.timeout.ms": "600000",
                },
            },
            "source": {"topics": ["orders"]},
            "sink": {"log": {}},
        },
    )
    oidc = consumer_pipeline(
        "oidc",
        {
            "kafka": {
                "bootstrapServers": silent_broker,
                "config": {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "OAUTHBEARER",
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.token.endpoint.url": "http://169.254.169.254/token",
                },
            },
            "source": {"topics": ["orders"]},
            "sink": {"log": {}},
        },
    )
    for manifest in (bounded, oidc):
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))

    wait_for(
        lambda: _operator_clients(kubectl, ns, "bounded").get("lagError"),
        timeout=120,
        what="status.operatorClients.lagError of the pipeline on the silent broker",
    )
    clients = _operator_clients(kubectl, ns, "bounded")
    assert silent_broker in clients["lagError"], clients
    assert sorted(clients["overridden"]) == [
        f"receive.message.max.bytes: {TENANTS_LIMIT} -> 4194304",
        "socket.timeout.ms: 600000 -> 2000",
    ], clients

    wait_for(
        lambda: _operator_clients(kubectl, ns, "oidc").get("lagError"),
        timeout=120,
        what="status.operatorClients.lagError of the pipeline with an OIDC token endpoint",
    )
    refused = _operator_clients(kubectl, ns, "oidc")["lagError"]
    assert "refused for the operator's clients" in refused, refused
    assert "sasl.oauthbearer" in refused, refused

    text = _status_text(control_plane, ns, "bounded")
    assert "operator lag: not measured:" in text and silent_broker in text, text
    assert (
        f"operator clients overrode receive.message.max.bytes: {TENANTS_LIMIT} -> 4194304" in text
    )
    text = _status_text(control_plane, ns, "oidc")
    assert "operator lag: not measured:" in text and "refused for the operator's clients" in text
