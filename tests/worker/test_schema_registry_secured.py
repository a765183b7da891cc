"""``source.schemaRegistry.secretRef`` against the live registry (Apicurio) serving HTTPS only
with HTTP basic auth (Quarkus' TLS settings and its properties-file security extension): the
worker reads username, password and ca.crt from the mounted Secret's files, decodes every
record, and never writes the password anywhere; refused credentials are an outage (records
wait), not the records' fault."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from support import registries
from support.registries import registry_secret
from support.schemas import order, serializer
from support.servers import started
from support.workers import (
    WorkerProcess,
    manifest,
    produce,
    read_all,
    wait_caught_up,
    write_manifest,
)

from offtake.config.spec import SchemaRegistrySpec, SecretRef
from offtake.formats.errors import RegistryUnavailable
from offtake.formats.resolve import schema_decoder
from offtake.schema_registry import SECRET_DIR_ENV, make_client
from offtake_testbed.apicurio import ApicurioRegistry, ApicurioTestbedError
from offtake_testbed.kafka import KafkaBroker

RECORDS = 50


@pytest.fixture(scope="module")
def secured_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    folder = tmp_path_factory.mktemp("registry-tls")
    with started(registries.secured_registry(folder), ApicurioTestbedError) as registry:
        yield registry


def test_the_registry_refuses_plain_http_unknown_certificates_and_anonymous_clients(
    secured_registry: ApicurioRegistry,
) -> None:
    assert secured_registry.url.startswith("https://")
    conf = secured_registry.client_config()
    anonymous = SchemaRegistryClient({k: v for k, v in conf.items() if "basic" not in k})
    with pytest.raises(SchemaRegistryError) as refused:
        anonymous.get_subjects()
    assert refused.value.http_status_code == 401
    plain = secured_registry.url.replace("https://", "http://")
    with pytest.raises(Exception):  # noqa: B017 - a TLS port answers no plain HTTP
        SchemaRegistryClient({**conf, "url": plain, "max.retries": 0, "timeout": 5}).get_subjects()
    untrusted = SchemaRegistryClient({"url": secured_registry.url, "max.retries": 0})
    with pytest.raises(Exception, match=r"(?i)certificate"):
        untrusted.get_subjects()
    assert isinstance(SchemaRegistryClient(secured_registry.client_config()).get_subjects(), list)


def test_a_worker_reads_credentials_and_ca_from_the_secret_and_decodes_everything(
    secured_registry: ApicurioRegistry,
    kafka_broker: KafkaBroker,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(), topic_factory(), topic_factory()
    encode = serializer(
        "avro", secured_registry.url, src, client_conf=secured_registry.client_config()
    )
    produce(kafka_broker.bootstrap, src, [encode(order(i)) for i in range(RECORDS)])
    password = next(iter(secured_registry.users.values()))
    secret_root = registry_secret(tmp_path / "secrets", secured_registry, password)
    doc = manifest(
        "schema-secured",
        kafka_broker.bootstrap,
        [src],
        sink={"kafka": {"topic": out}},
        errors={"policy": "dlq", "maxRetries": 0, "dlq": {"topic": dlq}},
    )
    doc["spec"]["source"].update(
        {
            "format": "avro",
            "schemaRegistry": {
                "url": secured_registry.url,
                "secretRef": {"name": "registry-credentials"},
            },
        }
    )
    manifest_path = write_manifest(tmp_path / "p.yaml", doc)
    worker = WorkerProcess(manifest_path, tmp_path / "w.log")
    worker.env[SECRET_DIR_ENV] = str(secret_root)
    worker.start()
    try:
        wait_caught_up(kafka_broker.bootstrap, doc["spec"]["source"]["groupId"], src, 1)
    finally:
        code = worker.terminate()
    assert code == 0, worker.output()[-3000:]
    delivered = sorted(
        (json.loads(m.value()) for m in read_all(kafka_broker.bootstrap, out)),
        key=lambda v: v["id"],
    )
    assert delivered == [order(i) for i in range(RECORDS)]
    assert read_all(kafka_broker.bootstrap, dlq) == []
    assert password not in worker.output()
    assert password not in manifest_path.read_text()

    # The Secret with a wrong password: the registry's 401 is an outage, not a dead letter.
    wrong = registry_secret(tmp_path / "wrong", secured_registry, "not-the-password")
    spec = SchemaRegistrySpec(secured_registry.url, SecretRef("registry-credentials"))
    decoder = schema_decoder("avro", make_client(spec, str(wrong)))
    with pytest.raises(RegistryUnavailable, match=r"401|nauthorized"):
        decoder.value(encode(order(1)), src)
