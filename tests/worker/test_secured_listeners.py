"""`offtake worker` through the secured listeners of a real broker, with Strimzi's Secrets.

Each pipeline gets its credentials the way a pod does: the Secrets Strimzi writes (a KafkaUser's,
the cluster CA's) are mapped by the operator's own code (offtake_operator.kafka_secret) into the
files of the mounted secret directory (OFFTAKE_KAFKA_SECRET_DIR stands in for the mount path)
and the non-secret properties of the pipeline's ConfigMap (the SCRAM user name). The worker
reads both and consumes through SCRAM-SHA-512, TLS, or TLS with a client certificate; its sink
produces through the same listener. The tests' own producers and checks use the broker's plain
listener.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.workers import (
    WorkerProcess,
    committed,
    end_offsets,
    ids_of,
    manifest,
    produce,
    read_all,
    wait_caught_up,
)

from offtake.config import load_pipeline
from offtake.kafka.config import secret_properties
from offtake_operator.kafka_secret import KafkaSecret, map_secret, with_cluster_ca
from offtake_operator.lag import measure_lag
from offtake_operator.render import pipeline_document
from offtake_testbed._pki import CertificateAuthority
from offtake_testbed.kafka import (
    MTLS_LISTENER,
    SCRAM_LISTENER,
    SCRAM_TLS_LISTENER,
    TLS_LISTENER,
    KafkaBroker,
)
from offtake_testbed.pytest_plugin import SCRAM_USER

RECORDS = 300
PARTITIONS = 3
# Fake PKCS#12 bytes: Strimzi's Secrets carry Java keystores beside the PEM keys; binary, and
# of no use to librdkafka.
P12 = bytes(range(256))


@dataclass
class Secured:
    """One way in: the listener, the Secrets Strimzi would write, the non-secret settings."""

    listener: str
    user_secret: dict[str, str | bytes] | None
    cluster_ca: bool
    config: dict[str, str]


def strimzi_scram_user(password: str) -> dict[str, str | bytes]:
    """What Strimzi's User Operator writes for a KafkaUser with SCRAM-SHA-512 authentication."""
    return {
        "password": password,
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{SCRAM_USER}" password="{password}";'
        ),
    }


def strimzi_tls_user(broker: KafkaBroker) -> dict[str, str | bytes]:
    """A KafkaUser with TLS authentication: its certificate, key, the *clients* CA, a keystore."""
    pair = broker.client_certificate("offtake-tls-user")
    return {
        "user.crt": pair.cert_pem,
        "user.key": pair.key_pem,
        "ca.crt": CertificateAuthority("strimzi-clients-ca").cert_pem,
        "user.p12": P12,
        "user.password": "p12-password",
    }


def cluster_ca_secret(ca_pem: str) -> dict[str, str | bytes]:
    """Strimzi's <cluster>-cluster-ca-cert: the CA that signed the brokers' certificates."""
    return {"ca.crt": ca_pem, "ca.p12": P12, "ca.password": "p12-password"}


def mount(
    secret_dir: Path, secrets: Mapping[str, Mapping[str, str | bytes]], mapped: KafkaSecret
) -> None:
    """Lay out ``secret_dir`` as the kubelet does for the operator's Secret volume: each
    mapped key of each Secret as a file named by its ``items`` path."""
    secret_dir.mkdir()
    for secret_name, files in mapped.mounts:
        for key, path in files.items():
            value = secrets[secret_name][key]
            (secret_dir / path).write_bytes(value if isinstance(value, bytes) else value.encode())


def text(data: Mapping[str, str | bytes]) -> dict[str, str]:
    """A Secret's data as the operator reads it (binary keystores come out empty)."""
    return {k: v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in data.items()}


@dataclass
class Deployed:
    """A pipeline manifest and secret directory as a pod of the operator's would get them."""

    manifest: Path
    secret_dir: Path
    group: str

    def worker(self, log: Path) -> WorkerProcess:
        return WorkerProcess(
            self.manifest, log, env={"OFFTAKE_KAFKA_SECRET_DIR": str(self.secret_dir)}
        )


def deploy(
    broker: KafkaBroker,
    tmp_path: Path,
    secured: Secured,
    source: str,
    output: str,
    **spec: Any,
) -> Deployed:
    secrets: dict[str, Mapping[str, str | bytes]] = {}
    mapped: KafkaSecret | None = None
    kafka: dict[str, Any] = {}
    if secured.user_secret is not None:
        secrets["pipeline-user"] = secured.user_secret
        mapped = map_secret("test", "pipeline-user", text(secured.user_secret))
        kafka["secretRef"] = {"name": "pipeline-user"}
    if secured.cluster_ca:
        secrets["my-cluster-cluster-ca-cert"] = cluster_ca_secret(broker.ca_pem)
        mapped = with_cluster_ca(
            mapped,
            "test",
            "my-cluster-cluster-ca-cert",
            text(secrets["my-cluster-cluster-ca-cert"]),
        )
        kafka["caSecretRef"] = {"name": "my-cluster-cluster-ca-cert"}
    assert mapped is not None
    doc = manifest(
        f"secured-{secured.listener.lower().replace('_', '-')}",
        broker.listener_bootstrap(secured.listener),
        [source],
        sink={"kafka": {"topic": output}},
        **spec,
    )
    doc["spec"]["kafka"].update(kafka)
    doc["spec"]["kafka"]["config"].update(secured.config)
    secret_dir = tmp_path / "kafka-secret"
    mount(secret_dir, secrets, mapped)
    # What the operator writes into the pipeline's ConfigMap: the spec plus the derived,
    # non-secret properties (the SCRAM user name read from sasl.jaas.config).
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline_document(doc, mapped.plain)))
    return Deployed(path, secret_dir, doc["spec"]["source"]["groupId"])


def scram(password: str) -> Secured:
    return Secured(
        SCRAM_LISTENER,
        strimzi_scram_user(password),
        cluster_ca=False,
        config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512"},
    )


def ways_in(broker: KafkaBroker) -> dict[str, Secured]:
    return {
        "scram-sha-512": scram(broker.scram_users[SCRAM_USER]),
        # Strimzi's usual combination: a SCRAM KafkaUser on a TLS listener, the brokers'
        # certificates checked against the cluster CA Secret.
        "scram-sha-512-over-tls": Secured(
            SCRAM_TLS_LISTENER,
            strimzi_scram_user(broker.scram_users[SCRAM_USER]),
            cluster_ca=True,
            config={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
        ),
        "tls": Secured(TLS_LISTENER, None, cluster_ca=True, config={"security.protocol": "SSL"}),
        "tls-client-certificate": Secured(
            MTLS_LISTENER,
            strimzi_tls_user(broker),
            cluster_ca=True,
            config={"security.protocol": "SSL"},
        ),
    }


@pytest.fixture
def topics(secured_kafka_broker: KafkaBroker) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        name = f"secured-{uuid.uuid4().hex[:10]}"
        secured_kafka_broker.create_topic(name, PARTITIONS)
        made.append(name)
        return name

    yield make
    for name in made:
        secured_kafka_broker.delete_topic(name, missing_ok=True)


@pytest.mark.parametrize(
    "way", ["scram-sha-512", "scram-sha-512-over-tls", "tls", "tls-client-certificate"]
)
def test_a_pipeline_consumes_through_each_secured_listener(
    way: str, secured_kafka_broker: KafkaBroker, topics: Callable[[], str], tmp_path: Path
) -> None:
    broker = secured_kafka_broker
    source, output = topics(), topics()
    deployed = deploy(broker, tmp_path, ways_in(broker)[way], source, output)
    produce(broker.bootstrap, source, ({"id": i} for i in range(RECORDS)))
    worker = deployed.worker(tmp_path / "worker.log").start()
    try:
        wait_caught_up(broker.bootstrap, deployed.group, source, PARTITIONS, timeout=120)
    finally:
        code = worker.terminate()
    assert code == 0, worker.output()[-3000:]
    assert sorted(ids_of(read_all(broker.bootstrap, output))) == list(range(RECORDS))
    for secret in ("sasl.password", "ssl.key.pem"):
        if (deployed.secret_dir / secret).is_file():
            assert (deployed.secret_dir / secret).read_text() not in worker.output(), secret
    ends = end_offsets(broker.bootstrap, source, PARTITIONS)
    assert committed(broker.bootstrap, deployed.group, source, PARTITIONS) == ends
    assert sum(ends.values()) == RECORDS


def log_entries(output: str) -> list[dict[str, Any]]:
    """The worker's JSON log lines (anything else on its stdout/stderr fails the test)."""
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_a_wrong_password_exits_3_at_once_with_an_authentication_error(
    secured_kafka_broker: KafkaBroker, topics: Callable[[], str], tmp_path: Path
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    source, output = topics(), topics()
    connect_timeout = 60
    deployed = deploy(secured_kafka_broker, tmp_path, scram(wrong), source, output)
    doc = yaml.safe_load(deployed.manifest.read_text())
    doc["spec"]["kafka"]["connectTimeoutSeconds"] = connect_timeout
    deployed.manifest.write_text(yaml.safe_dump(doc))
    began = time.monotonic()
    worker = deployed.worker(tmp_path / "worker.log").start()
    code = worker.wait(connect_timeout + 30)
    took = time.monotonic() - began
    output_text = worker.output()
    assert code == 3, output_text[-3000:]
    # A refusal is an answer: no waiting out spec.kafka.connectTimeoutSeconds.
    assert took < connect_timeout / 2, f"took {took:.1f}s"
    assert "Traceback" not in output_text
    entries = log_entries(output_text)
    final = [e for e in entries if e["level"] == "ERROR"][-1]
    assert final["logger"] == "offtake.cli"
    assert "refused the worker's credentials: authentication failed" in final["message"]
    assert "SCRAM-SHA-512" in final["message"]
    assert "spec.kafka.secretRef" in final["message"]
    assert wrong not in output_text
    assert committed(secured_kafka_broker.bootstrap, deployed.group, source, PARTITIONS) == {
        p: -1001 for p in range(PARTITIONS)
    }


def test_a_broker_certificate_from_another_ca_exits_3_with_a_tls_error(
    secured_kafka_broker: KafkaBroker, topics: Callable[[], str], tmp_path: Path
) -> None:
    source, output = topics(), topics()
    secured = Secured(TLS_LISTENER, None, cluster_ca=True, config={"security.protocol": "SSL"})
    deployed = deploy(secured_kafka_broker, tmp_path, secured, source, output)
    # The CA mounted is not the one that signed the broker's certificate.
    (deployed.secret_dir / "ssl.ca.pem").write_text(CertificateAuthority("other-ca").cert_pem)
    began = time.monotonic()
    worker = deployed.worker(tmp_path / "worker.log").start()
    code = worker.wait(90)
    output_text = worker.output()
    assert code == 3, output_text[-3000:]
    assert time.monotonic() - began < 30
    final = [e for e in log_entries(output_text) if e["level"] == "ERROR"][-1]
    assert final["message"].startswith("TLS with Kafka at 127.0.0.1:"), final
    assert "certificate verify failed" in final["message"]
    assert "Traceback" not in output_text


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as exc:  # /readyz answers 503 while not ready
        return str(exc.read().decode())


def test_the_password_appears_in_no_log_metric_or_probe_of_the_worker(
    secured_kafka_broker: KafkaBroker, topics: Callable[[], str], tmp_path: Path
) -> None:
    broker = secured_kafka_broker
    password = broker.scram_users[SCRAM_USER]
    source, output = topics(), topics()
    secured = scram(password)
    # Debug logging, the worker's and librdkafka's (its configuration and the SASL exchange
    # included), so that whatever could be logged is.
    secured.config["debug"] = "conf,security,broker,generic"
    deployed = deploy(broker, tmp_path, secured, source, output)
    produce(broker.bootstrap, source, ({"id": i} for i in range(RECORDS)))
    worker = deployed.worker(tmp_path / "worker.log")
    worker.env["OFFTAKE_LOG_LEVEL"] = "DEBUG"
    worker.start()
    pages: dict[str, str] = {}
    try:
        port = worker.metrics_port(timeout=180)
        wait_caught_up(broker.bootstrap, deployed.group, source, PARTITIONS, timeout=120)
        for path in ("/metrics", "/healthz", "/readyz"):
            pages[path] = get(f"http://127.0.0.1:{port}{path}")
    finally:
        code = worker.terminate()
    assert code == 0, worker.output()[-3000:]
    assert sorted(ids_of(read_all(broker.bootstrap, output))) == list(range(RECORDS))
    assert "offtake_" in pages["/metrics"], pages["/metrics"][:500]
    logs = worker.output()
    # librdkafka dumped its configuration (it writes "[redacted]" for secret properties
    # itself), and every log line passes through offtake.redact, which masks the value again.
    assert "sasl.password = ***" in logs
    for where, seen in {"stdout/stderr": logs, **pages}.items():
        assert password not in seen, where
    # The manifest a pod reads (its ConfigMap) does not hold it either: only the mounted files.
    assert password not in deployed.manifest.read_text()
    assert (deployed.secret_dir / "sasl.password").read_text() == password


@pytest.mark.parametrize("way", ["scram-sha-512-over-tls", "tls-client-certificate"])
def test_the_operators_allowlisted_clients_reach_each_secured_listener(
    way: str, secured_kafka_broker: KafkaBroker, topics: Callable[[], str], tmp_path: Path
) -> None:
    """The operator's lag reading keeps only connection and security properties: enough for
    SASL over TLS and for client certificates, while a tenant's file path (which, kept, would
    clash with the Secret's ssl.ca.pem and fail the client) and tuning are dropped."""
    broker = secured_kafka_broker
    source = topics()
    secured = ways_in(broker)[way]
    tenant = {"ssl.ca.location": "/nonexistent/ca.pem", "statistics.interval.ms": "1000"}
    secured = Secured(
        secured.listener, secured.user_secret, secured.cluster_ca, {**secured.config, **tenant}
    )
    deployed = deploy(broker, tmp_path, secured, source, topics())
    produce(broker.bootstrap, source, ({"id": i} for i in range(RECORDS)))
    pipeline = load_pipeline(deployed.manifest)
    report = measure_lag(pipeline, secret_properties(str(deployed.secret_dir)), timeout=20)
    assert (report.lag, report.partitions) == (RECORDS, PARTITIONS)
