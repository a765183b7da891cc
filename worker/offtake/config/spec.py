"""The ConsumerPipeline spec as typed, validated values.

Field names follow crds/consumerpipeline.yaml (documented in docs/worker.md). The defaults are
the CRD's alone: the loader fills them in from it (offtake.config._fields), so a field the CRD
gives a default has none here; the defaults left (None, empty) mean "not set". Classes where
such a field precedes one the CRD defaults are keyword-only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Format = Literal["json", "string", "bytes", "avro", "protobuf", "jsonschema"]
#: The formats whose values carry a schema id (Confluent wire format) and need a registry.
SCHEMA_FORMATS = ("avro", "protobuf", "jsonschema")
StartFrom = Literal["earliest", "latest"]
#: consumer: a consumer group (partitions shared out, offsets committed); share: a KIP-932
#: share group (queue mode: records shared out, each acknowledged on its own).
GroupType = Literal["consumer", "share"]
ErrorPolicyName = Literal["dlq", "skip", "stop"]
Ordering = Literal["relaxed", "strict"]
SparkFormat = Literal["parquet", "json", "delta", "iceberg", "jdbc"]
SparkMode = Literal["local", "connect", "kubernetes"]
Mode = Literal["deployment", "inject"]


@dataclass(frozen=True)
class SecretRef:
    name: str


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the pipeline's namespace: the operator hands it to the worker as
    an environment variable (``valueFrom.secretKeyRef``), never through the ConfigMap."""

    name: str
    key: str


@dataclass(frozen=True, kw_only=True)
class KafkaSpec:
    bootstrap_servers: str
    config: dict[str, str] = field(default_factory=dict)
    secret_ref: SecretRef | None = None
    #: A Secret whose ca.crt verifies the brokers (Strimzi's <cluster>-cluster-ca-cert); the
    #: operator mounts it with the credentials as ssl.ca.pem.
    ca_secret_ref: SecretRef | None = None
    connect_timeout_seconds: float
    #: cooperative-sticky, range, roundrobin (classic protocol, client-side assignors) or
    #: consumer (KIP-848: the broker assigns); None: kafka.config's strategy, else
    #: cooperative-sticky.
    group_protocol: str | None = None
    #: group.instance.id from the pod name (KIP-345): a restarted container keeps its partitions.
    static_membership: bool


@dataclass(frozen=True)
class SchemaRegistrySpec:
    """A Confluent-compatible schema registry (Confluent, Apicurio's ccompat API, Karapace)."""

    url: str
    #: A Secret with basic auth (username, password) and TLS (ca.crt, tls.crt, tls.key) files.
    secret_ref: SecretRef | None = None


@dataclass(frozen=True)
class SourceSpec:
    #: Topic names, or regular expressions starting with ``^`` (librdkafka's subscription).
    topics: tuple[str, ...]
    group_id: str
    group_type: GroupType
    start_from: StartFrom
    format: Format
    schema_registry: SchemaRegistrySpec | None = None
    #: protobuf: the generated message class values decode into (module:Class).
    protobuf_message: str | None = None

    @property
    def patterns(self) -> tuple[str, ...]:
        """The entries of ``topics`` that are regular expressions (``^...``)."""
        return tuple(t for t in self.topics if is_topic_pattern(t))

    @property
    def is_share_group(self) -> bool:
        return self.group_type == "share"


def is_topic_pattern(topic: str) -> bool:
    """librdkafka's rule: a subscription entry starting with ``^`` is a regular expression."""
    return topic.startswith("^")


def matching_topics(entries: Iterable[str], existing: Iterable[str]) -> list[str]:
    """The topics a subscription to ``entries`` covers among ``existing`` topic names, sorted.

    A name stands for itself (whether or not it exists yet); a pattern matches the way
    librdkafka matches it (a regular-expression search, anchored by its leading ``^``), never
    an internal topic (``__consumer_offsets``, ``__transaction_state``).
    """
    names = set(existing)
    out = {t for t in entries if not is_topic_pattern(t)}
    for pattern in (re.compile(t) for t in entries if is_topic_pattern(t)):
        out.update(n for n in names if not n.startswith("__") and pattern.search(n))
    return sorted(out)


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    port: int
    path: str
    timeout_seconds: float
    max_batch_records: int


Order = Literal["key", "partition", "none"]


@dataclass(frozen=True, kw_only=True)
class ProcessorSpec:
    function: str | None = None
    container: ContainerSpec | None = None
    # The function takes a list of records and returns one result per record (in order).
    batch: bool
    # Processes running the function (CPU-bound code); order and commits as with one.
    parallelism: int
    # Set either, and the function runs in pool processes (processing/parallel.py): a call
    # past the timeout is killed (that record's error), a process past the memory is replaced.
    # Unset (the default): the function runs in the worker's thread, no timeout, no recycling.
    timeout_seconds: float | None = None
    max_memory_mib: int | None = None
    # Calls in flight in one worker (engine/scheduler.py): async def on the worker's event
    # loop, plain def on this many threads. 1 (the default): one call at a time, today's path.
    concurrency: int = 1
    # With concurrency > 1, what may overlap: records of one key, of one partition, or any.
    order: Order = "key"
    # module:callable returning a context manager (sync or async) the function's calls share,
    # entered once before the first call and exited at shutdown (processing/function.py).
    lifespan: str | None = None

    @property
    def in_processes(self) -> bool:
        """Whether the function runs in pool processes rather than the worker's thread."""
        return self.function is not None and (
            self.parallelism > 1
            or self.timeout_seconds is not None
            or self.max_memory_mib is not None
        )


SinkFormat = Literal["json", "avro", "protobuf", "jsonschema"]


@dataclass(frozen=True)
class SinkSchemaSpec:
    """The schema the Kafka sink encodes with (sink.kafka.format avro | jsonschema)."""

    #: A schema file in the worker image (.avsc, .json); without it: the subject's latest.
    file: str | None = None
    #: The subject the schema is looked up (or registered) under; default <topic>-value.
    subject: str | None = None


@dataclass(frozen=True, kw_only=True)
class KafkaSinkSpec:
    topic: str
    config: dict[str, str] = field(default_factory=dict)
    # "exactly-once": produced records and consumed offsets commit in one Kafka transaction.
    delivery: str
    #: json: bytes as they are, text as UTF-8, anything else as JSON (no schema); the others
    #: encode in the schema registry wire format.
    format: SinkFormat
    schema: SinkSchemaSpec | None = None
    #: protobuf: the generated message class values are encoded as (module:Class).
    protobuf_message: str | None = None
    #: Register the schema if it is not (off by default: registries are usually governed).
    auto_register: bool
    #: The registry to encode with (the loader fills in source.schemaRegistry when unset).
    schema_registry: SchemaRegistrySpec | None = None

    @property
    def exactly_once(self) -> bool:
        return self.delivery == "exactly-once"


@dataclass(frozen=True)
class LogSinkSpec:
    pass


@dataclass(frozen=True)
class JdbcSpec:
    url: str
    table: str
    secret_ref: SecretRef | None = None
    user: str | None = None
    #: The password alone, one key of a Secret (secret_ref: a Secret with user and password).
    password_secret_ref: SecretKeyRef | None = None


@dataclass(frozen=True)
class IcebergSpec:
    table: str
    #: Without a password: that comes from password_secret_ref.
    catalog_uri: str
    password_secret_ref: SecretKeyRef | None = None


@dataclass(frozen=True)
class SparkBatchSpec:
    max_records: int
    max_interval_seconds: float
    max_bytes: int


@dataclass(frozen=True)
class SparkServerSpec:
    """The Spark Connect server's pod (mode kubernetes)."""

    cores: int
    memory: str


@dataclass(frozen=True)
class SparkExecutorsSpec:
    """The Spark Connect server's executor pods (mode kubernetes)."""

    instances: int
    cores: int
    memory: str


@dataclass(frozen=True, kw_only=True)
class SparkSubmitSpec:
    mode: SparkMode
    master: str
    connect_url: str | None = None
    #: mode connect: the server's token (``;token=`` of the URL), from a Secret.
    token_secret_ref: SecretKeyRef | None = None
    conf: dict[str, str] = field(default_factory=dict)
    # mode kubernetes: the SparkConnect the operator makes.
    image: str | None = None
    service_account: str | None = None
    server: SparkServerSpec
    executors: SparkExecutorsSpec


@dataclass(frozen=True, kw_only=True)
class SparkSinkSpec:
    format: SparkFormat
    path: str | None = None
    jdbc: JdbcSpec | None = None
    iceberg: IcebergSpec | None = None
    partition_by: tuple[str, ...] = ()
    transform: str | None = None
    sql: str | None = None
    batch: SparkBatchSpec
    submit: SparkSubmitSpec
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class SinkSpec:
    kafka: KafkaSinkSpec | None = None
    spark: SparkSinkSpec | None = None
    log: LogSinkSpec | None = None

    @property
    def kind(self) -> Literal["kafka", "spark", "log"]:
        if self.kafka is not None:
            return "kafka"
        if self.spark is not None:
            return "spark"
        return "log"


@dataclass(frozen=True)
class CommitSpec:
    interval_seconds: float


@dataclass(frozen=True)
class LimitsSpec:
    max_in_flight_messages: int
    max_in_flight_bytes: int


@dataclass(frozen=True)
class DlqSpec:
    topic: str


@dataclass(frozen=True)
class RetryTopicSpec:
    """One step of non-blocking retries: the record waits ``delay_seconds`` on its retry topic."""

    delay_seconds: int


def retry_topic_name(topic: str, delay_seconds: int) -> str:
    """The retry topic of a source topic for one delay: ``orders.retry-10s``."""
    return f"{topic}.retry-{delay_seconds}s"


@dataclass(frozen=True, kw_only=True)
class ErrorsSpec:
    policy: ErrorPolicyName
    max_retries: int
    retry_backoff_seconds: float
    dlq: DlqSpec | None = None
    #: Non-blocking retries, in order, before the policy applies (docs/worker.md, Errors).
    retry_topics: tuple[RetryTopicSpec, ...] = ()
    #: "strict": a failing record holds the records behind it on its partition until settled.
    ordering: Ordering

    def retry_topic_names(self, source_topics: tuple[str, ...]) -> list[str]:
        """Every retry topic the pipeline produces to and consumes, per source topic in order."""
        return [
            retry_topic_name(t, r.delay_seconds) for t in source_topics for r in self.retry_topics
        ]


@dataclass(frozen=True)
class ShutdownSpec:
    drain_timeout_seconds: float


@dataclass(frozen=True)
class MetricsSpec:
    port: int
    #: The kubelet's probe listener (the operator starts it with ``--probe-port``).
    probe_port: int = 9101


@dataclass(frozen=True)
class PipelineSpec:
    """A whole ConsumerPipeline: metadata plus the validated spec."""

    name: str
    namespace: str
    kafka: KafkaSpec
    source: SourceSpec
    sink: SinkSpec
    processor: ProcessorSpec
    commit: CommitSpec
    limits: LimitsSpec
    errors: ErrorsSpec
    shutdown: ShutdownSpec
    metrics: MetricsSpec
    replicas: int
    paused: bool
    #: deployment: the operator's own Deployment of workers; inject: a sidecar of the user's pods.
    mode: Mode
