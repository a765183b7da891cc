"""The Spark sink's typed columns and a schema registry that refuses (issue 38 item 6): the
decoders' rule. A 401/403 for one schema id while the registry answers the pipeline's other
requests fails that id's records alone, with the id and the registry's answer (the DLQ's
headers), and the rest of the batch is written; a registry that refuses every id (or the
pipeline's credentials) is an outage the sink waits out without spending the batch's
attempts, and the batch is written once the registry answers.

The registry is the real Apicurio serving HTTPS with HTTP basic auth, behind the real HTTP
proxy of support.registries that answers 403 for the ids a test denies (Apicurio here cannot
refuse one artifact: see there); Spark is the shared local session, writing parquet."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from support import registries
from support.registries import DenyingProxy, two_schemas
from support.schemas import order
from support.servers import started

from offtake.config.loader import parse_pipeline
from offtake.config.spec import PipelineSpec
from offtake.engine.dead_letters import dlq_headers
from offtake.formats.errors import SCHEMA_REFUSED, SchemaDecodeError
from offtake.formats.wire import wire_schema_id
from offtake.headers import H_ERROR_MESSAGE, H_REASON, H_SCHEMA_ID, H_STAGE
from offtake.metrics import Metrics
from offtake.records import Record
from offtake.sinks.base import SinkBatch, SinkItem
from offtake.sinks.spark import SparkSink
from offtake_testbed.apicurio import ApicurioRegistry, ApicurioTestbedError

from .support import Collector, metric

pytestmark = pytest.mark.spark

TOPIC = "orders"
RECORDS = 10
DENIED_AT = (3, 7)  # offsets whose values are of the denied (another team's) schema id


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    folder = tmp_path_factory.mktemp("registry-tls")
    with started(registries.secured_registry(folder), ApicurioTestbedError) as registry:
        yield registry


@pytest.fixture
def proxy(secured: ApicurioRegistry) -> Iterator[DenyingProxy]:
    assert secured.tls is not None
    with DenyingProxy(secured.url, secured.tls.ca) as p:
        yield p


def _spec(path: Path, registry_url: str) -> PipelineSpec:
    return parse_pipeline(
        {
            "apiVersion": "offtake.dev/v1alpha1",
            "kind": "ConsumerPipeline",
            "metadata": {"name": "refused-columns", "namespace": "test"},
            "spec": {
                "kafka": {"bootstrapServers": "unused:9092"},
                "source": {
                    "topics": [TOPIC],
                    "format": "avro",
                    "schemaRegistry": {"url": registry_url},
                },
                "sink": {"spark": {"format": "parquet", "path": str(path)}},
                # No retry to spend: an outage counted as an attempt would fail the batch.
                "errors": {
                    "policy": "dlq",
                    "dlq": {"topic": "orders-dlq"},
                    "maxRetries": 0,
                    "retryBackoffSeconds": 0.05,
                },
            },
        }
    )


def _client(registry: ApicurioRegistry, url: str, password: str | None = None) -> Any:
    """A client with the registry's credentials (or a wrong ``password``) at ``url``."""
    conf: dict[str, Any] = {**registry.client_config(), "url": url, "max.retries": 0}
    if password is not None:
        conf["basic.auth.user.info"] = f"{registries.USER}:{password}"
    if not url.startswith("https://"):
        conf.pop("ssl.ca.location", None)
    return SchemaRegistryClient(conf)


def _items(values: list[bytes]) -> list[SinkItem]:
    out = []
    for offset, raw in enumerate(values):
        decoded = order(offset)  # what the source's decoder made of it
        record = Record(TOPIC, 0, offset, b"k", decoded, (), 1_700_000_000_000, raw)
        out.append(SinkItem(record, [decoded]))
    return out


def _values(registry: ApicurioRegistry) -> tuple[list[bytes], int]:
    theirs, ours = two_schemas(registry.url, TOPIC, registry.client_config())
    values = [(theirs if i in DENIED_AT else ours)(order(i)) for i in range(RECORDS)]
    denied_id = wire_schema_id(values[DENIED_AT[0]])
    assert denied_id != wire_schema_id(values[0])
    return values, denied_id


def _until(done: Callable[[], bool], sink: SparkSink, seconds: float = 240.0) -> None:
    """Drive the sink (the engine's drain) until ``done()``; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the sink did not get there in time"
        sink.drain(None, 0.5)


def test_a_refused_schema_id_fails_its_records_alone_and_the_rest_is_written(
    secured: ApicurioRegistry, proxy: DenyingProxy, spark: Any, tmp_path: Path
) -> None:
    values, denied_id = _values(secured)
    proxy.denied.add(denied_id)
    path = tmp_path / "table"
    sink = SparkSink(
        _spec(path, proxy.url),
        Metrics("test"),
        session=spark,
        schema_registry=_client(secured, proxy.url),
    )
    done = Collector()
    sink.start(done)
    try:
        sink.submit(SinkBatch.of(_items(values)))
        _until(lambda: done.count == RECORDS, sink)
    finally:
        sink.close()

    assert sorted(it.record.offset for it in done.ok) == [
        i for i in range(RECORDS) if i not in DENIED_AT
    ]
    assert sorted(it.record.offset for it, _ in done.failed) == list(DENIED_AT)
    for it, error in done.failed:
        assert isinstance(error, SchemaDecodeError)
        assert error.headers == {H_SCHEMA_ID: str(denied_id), H_REASON: SCHEMA_REFUSED}
        # The dead letter the engine writes for it: the id and the registry's own answer.
        headers = dict(dlq_headers(it.record, error, 1, "sink"))
        assert headers[H_SCHEMA_ID] == str(denied_id).encode()
        assert headers[H_REASON] == SCHEMA_REFUSED.encode()
        assert headers[H_STAGE] == b"sink"
        message = headers[H_ERROR_MESSAGE].decode()
        assert f"schema id {denied_id} is refused by the schema registry" in message
        assert "403" in message and "denied operation Read" in message
    table = pq.read_table(path)
    assert sorted(table.column("offset").to_pylist()) == [
        i for i in range(RECORDS) if i not in DENIED_AT
    ]
    assert str(table.schema.field("id").type) == "int64"  # typed by the writer's schema


def test_a_registry_refusing_every_id_is_an_outage_waited_out_then_the_batch_lands(
    secured: ApicurioRegistry, proxy: DenyingProxy, spark: Any, tmp_path: Path
) -> None:
    values, _ = _values(secured)
    path = tmp_path / "table"
    metrics = Metrics("test")
    sink = SparkSink(
        _spec(path, proxy.url),
        metrics,
        session=spark,
        schema_registry=_client(secured, proxy.url),
    )
    done = Collector()
    proxy.deny_all = True
    sink.start(done)
    try:
        sink.submit(SinkBatch.of(_items(values)))

        def waited_twice() -> bool:
            return metric(metrics, "offtake_spark_jobs_total", result="retry") >= 2

        _until(waited_twice, sink)
        assert done.count == 0, "nothing settled, nothing dead-lettered, during the outage"
        proxy.deny_all = False
        _until(lambda: done.count == RECORDS, sink)
    finally:
        sink.close()
    assert not done.failed and len(done.ok) == RECORDS
    assert metric(metrics, "offtake_spark_jobs_total", result="failure") == 0
    assert sorted(pq.read_table(path).column("offset").to_pylist()) == list(range(RECORDS))


def test_the_real_registrys_401_for_wrong_credentials_is_an_outage_not_a_dead_letter(
    secured: ApicurioRegistry, spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No proxy: Apicurio itself refuses the password, for the schema id and the listing."""
    caplog.set_level(logging.WARNING, logger="offtake")
    values, _ = _values(secured)
    metrics = Metrics("test")
    sink = SparkSink(
        _spec(tmp_path / "table", secured.url),
        metrics,
        session=spark,
        schema_registry=_client(secured, secured.url, password="not-the-password"),
    )
    done = Collector()
    sink.start(done)
    try:
        sink.submit(SinkBatch.of(_items(values)))
        _until(lambda: metric(metrics, "offtake_spark_jobs_total", result="retry") >= 2, sink)
        assert done.count == 0
    finally:
        sink.close()
    said = [r.getMessage() for r in caplog.records]
    unavailable = [m for m in said if "the sink is unavailable" in m]
    assert unavailable and "refuses this pipeline's credentials" in unavailable[0]
    assert "401" in unavailable[0]
    assert not (tmp_path / "table").exists()
