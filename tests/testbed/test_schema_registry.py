"""The test bed's real schema registry: Apicurio Registry built from Maven Central, serving the
Confluent-compatible API that confluent-kafka's own client and serializers speak."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from offtake_testbed.apicurio import ApicurioRegistry, install_apicurio

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}


def test_cached_install_is_not_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    install_apicurio()  # may be the cold build when this test runs first

    def build_again(*args: object) -> None:
        raise AssertionError("a cached install built the registry again")

    monkeypatch.setattr("offtake_testbed.apicurio.install._build", build_again)
    runner = install_apicurio()
    assert runner.name.endswith("-runner.jar")
    assert (runner.parent / "lib").is_dir()


def test_registers_and_serves_schemas_by_id(schema_registry: ApicurioRegistry) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = f"testbed-{time.monotonic_ns()}-value"
    schema_id = client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    assert subject in schema_registry.subjects()
    fetched = client.get_schema(schema_id)
    assert fetched.schema_type == "AVRO"
    assert json.loads(fetched.schema_str)["name"] == "Order"
    # Registering the same schema again answers the same id (what serializers rely on).
    assert client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO")) == schema_id
    with pytest.raises(SchemaRegistryError) as unknown:
        client.get_schema(987_654)
    assert unknown.value.http_status_code == 404


def test_a_frozen_registry_times_out_and_answers_again_after(
    schema_registry: ApicurioRegistry,
) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url, "timeout": 2, "max.retries": 0})
    schema_registry.freeze()
    try:
        with pytest.raises(Exception) as timed_out:
            client.get_subjects()
        assert "Timeout" in type(timed_out.value).__name__
    finally:
        schema_registry.thaw()
    assert isinstance(client.get_subjects(), list)
