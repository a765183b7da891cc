"""Read a ConsumerPipeline manifest (YAML or JSON) into a :class:`PipelineSpec`.

Every problem raises :class:`ConfigError` naming the field's path, e.g.
``spec.limits.maxInFlightMessages: expected an integer, got the string 'lots'``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from offtake.config._fields import ConfigError, Fields
from offtake.config.client_properties import (
    is_secret_property,
    map_key,
    refused_reason,
    share_refusal,
)
from offtake.config.crd_check import crd_schema
from offtake.config.in_process import check_lifespan, refuse_pool_clashes
from offtake.config.redrive import dlq_topic_of, parse_redrive
from offtake.config.refs import secret_ref
from offtake.config.spark_sink import spark_sink
from offtake.config.spec import (
    SCHEMA_FORMATS,
    CommitSpec,
    ContainerSpec,
    DlqSpec,
    ErrorPolicyName,
    ErrorsSpec,
    Format,
    GroupType,
    KafkaSinkSpec,
    KafkaSpec,
    LimitsSpec,
    LogSinkSpec,
    MetricsSpec,
    Mode,
    Order,
    Ordering,
    PipelineSpec,
    ProcessorSpec,
    RetryTopicSpec,
    SchemaRegistrySpec,
    ShutdownSpec,
    SinkFormat,
    SinkSchemaSpec,
    SinkSpec,
    SourceSpec,
    StartFrom,
    is_topic_pattern,
)
from offtake.redact import redact

API_VERSION = "offtake.dev/v1alpha1"
KIND = "ConsumerPipeline"


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read and validate the manifest at ``path``."""
    return parse_pipeline(read_manifest(path))


def read_manifest(path: str | Path) -> Mapping[str, Any]:
    """The one ConsumerPipeline document of the YAML (or JSON) file at ``path``, unvalidated."""
    try:
        with Path(path).open(encoding="utf-8") as stream:
            # A stream, not its text: PyYAML's error marks then name the file, not <unicode
            # string>.
            docs = [d for d in yaml.safe_load_all(stream) if d is not None]
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the manifest: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), f"not valid YAML: {exc}") from None
    pipelines = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == KIND]
    if len(pipelines) != 1:
        found = "none" if not pipelines else str(len(pipelines))
        others = sorted(
            {
                repr(d["kind"]) if d.get("kind") is not None else "a document without kind"
                for d in docs
                if isinstance(d, Mapping) and d.get("kind") != KIND
            }
        )
        seen = f" (other kinds in the file: {', '.join(others)})" if others else ""
        raise ConfigError(
            str(path), f"expected exactly one document of kind {KIND}, found {found}{seen}"
        )
    return cast(Mapping[str, Any], pipelines[0])


def parse_pipeline(doc: Mapping[str, Any]) -> PipelineSpec:
    """Validate one manifest (already parsed) and return its spec."""
    top = Fields(doc, "", crd_schema())
    api_version = top.text("apiVersion")
    if api_version != API_VERSION:
        raise ConfigError("apiVersion", f"expected {API_VERSION}, got {api_version!r}")
    if top.text("kind") != KIND:
        raise ConfigError("kind", f"expected {KIND}, got {top.raw['kind']!r}")
    meta = top.sub("metadata", required=True)
    assert meta is not None
    name = meta.text("name")
    namespace = meta.text("namespace", "default")
    spec = top.sub("spec", required=True)
    assert spec is not None
    top.has("status")  # status is the operator's; a manifest copied from the cluster may carry it
    top._seen.update({"status"})
    # In this order, so the first error reported is the first field in the manifest's order.
    mode = spec.choice("mode")
    kafka = _kafka(spec.sub("kafka", required=True))
    source = _source(spec.sub("source", required=True), f"{namespace}.{name}")
    pipeline = PipelineSpec(
        name=name,
        namespace=namespace,
        kafka=kafka,
        source=source,
        processor=_processor(
            spec.section("processor"), inject=mode == "inject", written=spec.has("processor")
        ),
        sink=_sink(spec.sub("sink", required=True), source.schema_registry),
        commit=_commit(spec.section("commit")),
        limits=_limits(spec.section("limits")),
        errors=_errors(spec.section("errors")),
        shutdown=_shutdown(spec.section("shutdown")),
        metrics=_metrics(spec.section("metrics")),
        replicas=spec.integer("replicas"),
        paused=spec.flag("paused"),
        mode=cast(Mode, mode),
    )
    if pipeline.mode == "inject" and pipeline.paused:
        raise ConfigError(
            "spec.paused",
            "not available with mode: inject (the workers are in the workload's pods: scale "
            "the workload to zero instead)",
        )
    spec._seen.update(OPERATOR_ONLY_FIELDS)
    spec.done()
    _check_combinations(pipeline)
    # Not the worker's to act on, but checked here so that a bad request is named by
    # `offtake validate` and by the operator's pass through this loader alike.
    raw_spec = doc["spec"]
    parse_redrive(raw_spec.get("redrive"), dlq_topic_of(raw_spec))
    return pipeline


def _check_combinations(pipeline: PipelineSpec) -> None:
    """What two sections allow alone and not together (queue mode with exactly-once, retry
    topics with a share group or a topic pattern), each error naming the field to change."""
    kafka_sink = pipeline.sink.kafka
    if pipeline.source.is_share_group and kafka_sink is not None and kafka_sink.exactly_once:
        raise ConfigError(
            "spec.sink.kafka.delivery",
            "exactly-once cannot be combined with spec.source.groupType share: Kafka has no "
            "transactional acknowledgement for share groups (use at-least-once, or groupType "
            "consumer)",
        )
    if pipeline.source.is_share_group and (
        refusal := share_refusal("spec.kafka.config", pipeline.kafka.config)
    ):
        raise ConfigError(*refusal)
    if pipeline.source.is_share_group and pipeline.errors.retry_topics:
        raise ConfigError(
            "spec.errors.retryTopics",
            "cannot be combined with spec.source.groupType share: a share group retries a "
            "record by delivering it again (errors.maxRetries counts the deliveries)",
        )
    if pipeline.source.is_share_group and pipeline.errors.max_retries > MAX_SHARE_RETRIES:
        raise ConfigError(
            "spec.errors.maxRetries",
            f"must be at most {MAX_SHARE_RETRIES} with spec.source.groupType share (the broker's "
            "delivery-count limit is at most 10 and is set to maxRetries + 2), got "
            f"{pipeline.errors.max_retries}",
        )
    if pipeline.source.patterns and pipeline.errors.retry_topics:
        raise ConfigError(
            "spec.errors.retryTopics",
            "cannot be combined with a topic pattern in spec.source.topics "
            f"({pipeline.source.patterns[0]!r}): each retry topic is named after one source "
            "topic; list the topics by name to use retry topics",
        )


#: Spec fields the operator acts on and the worker has no use for: accepted, not interpreted
#: here (the operator leaves them out of the worker's pipeline.yaml).
OPERATOR_ONLY_FIELDS = (
    "rewind",
    "redrive",
    "autoscaling",
    "template",
    "resources",
    "image",
    "serviceMonitor",
    "slo",
)


def _kafka(f: Fields | None) -> KafkaSpec:
    assert f is not None
    secret = f.sub("secretRef")
    config = client_config_map(f, "config", "spec.kafka.secretRef")
    out = KafkaSpec(
        bootstrap_servers=f.text("bootstrapServers"),
        config=config,
        secret_ref=secret_ref(secret),
        ca_secret_ref=secret_ref(f.sub("caSecretRef")),
        connect_timeout_seconds=f.number("connectTimeoutSeconds"),
        group_protocol=f.choice("groupProtocol") if f.has("groupProtocol") else None,
        static_membership=f.flag("staticMembership"),
    )
    if out.group_protocol is not None and "partition.assignment.strategy" in config:
        raise ConfigError(
            f.at("groupProtocol"),
            "set either groupProtocol or kafka.config's partition.assignment.strategy, not both",
        )
    f.done()
    return out


def client_config_map(f: Fields, key: str, secret_field: str) -> dict[str, str]:
    """A ``config`` map of client properties, refusing what loads code or runs a command and
    what is a secret, each naming the entry (``spec.kafka.config["plugin.library.paths"]``)."""
    config = f.str_map(key)
    for name, value in config.items():
        where = map_key(f.at(key), name)
        reason = refused_reason(name, value)
        if reason is not None:
            raise ConfigError(where, f"refused: {reason} (docs/worker.md, Client properties)")
        if is_secret_property(name):
            raise ConfigError(
                where,
                "is a secret and must not be inline (it would be stored in plain text in the "
                f"pipeline and its ConfigMap): put it in a Secret and name that in {secret_field}",
            )
    return config


#: Share groups: the broker archives a record after share.delivery.count.limit deliveries (at
#: most 10); the worker sets it to maxRetries + 2 (offtake.kafka.share_source.group_settings).
MAX_SHARE_RETRIES = 8


def _source(f: Fields | None, default_group: str) -> SourceSpec:
    assert f is not None
    topics = f.str_list("topics", required=True)
    for i, topic in enumerate(topics):
        _check_topic_pattern(f"{f.at('topics')}[{i}]", topic)
    fmt = cast(Format, f.choice("format"))
    registry = _schema_registry(f.sub("schemaRegistry"))
    message = f.opt_str("protobufMessage")
    if fmt in SCHEMA_FORMATS and registry is None:
        raise ConfigError(f.at("schemaRegistry"), f"is required when format is {fmt}")
    if fmt == "protobuf" and message is None:
        raise ConfigError(
            f.at("protobufMessage"),
            "is required when format is protobuf: the generated message class (module:Class) "
            "that values decode into",
        )
    if message is not None and (fmt != "protobuf" or ":" not in message):
        problem = "expected module:Class" if fmt == "protobuf" else "is only for format protobuf"
        raise ConfigError(f.at("protobufMessage"), problem)
    return f.finish(
        SourceSpec(
            topics=topics,
            group_id=f.text("groupId", default_group),
            group_type=cast(GroupType, f.choice("groupType")),
            start_from=cast(StartFrom, f.choice("startFrom")),
            format=fmt,
            schema_registry=registry,
            protobuf_message=message,
        )
    )


def _check_topic_pattern(path: str, topic: str) -> None:
    if not is_topic_pattern(topic):
        return
    try:
        re.compile(topic)
    except re.error as exc:
        raise ConfigError(path, f"not a valid regular expression: {exc}") from None


def _schema_registry(f: Fields | None) -> SchemaRegistrySpec | None:
    if f is None:
        return None
    url = f.text("url")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f.at("url"), f"expected an http:// or https:// URL, got {redact(url)!r}")
    return f.finish(SchemaRegistrySpec(url=url, secret_ref=secret_ref(f.sub("secretRef"))))


def _processor(f: Fields, *, inject: bool, written: bool) -> ProcessorSpec:
    if inject and not written:
        raise ConfigError(
            f.at("container"),
            "required with spec.mode: inject (the port the application container listens "
            "on for the sidecar protocol)",
        )
    function = f.opt_str("function")
    if function is not None and (":" not in function or function.startswith(":")):
        raise ConfigError(f.at("function"), f"expected module:callable, got {function!r}")
    c = f.sub("container")
    container = None
    if c is not None:
        image = (c.opt_str("image") or "") if inject else c.text("image")
        if inject and image:
            raise ConfigError(
                c.at("image"),
                "not used with spec.mode: inject: the application container of each annotated "
                "pod is the processor",
            )
        container = ContainerSpec(
            image=image,
            port=c.integer("port"),
            path=c.text("path"),
            timeout_seconds=c.number("timeoutSeconds"),
            max_batch_records=c.integer("maxBatchRecords"),
        )
        c._seen.update(
            {"resources", "env", "envFrom", "command", "args", "imagePullPolicy", "securityContext"}
        )
        c.done()
    if function is not None and container is not None:
        raise ConfigError(f.path, "set either function or container, not both")
    lifespan = f.opt_str("lifespan")
    check_lifespan(f, lifespan, function)
    batch = f.flag("batch")
    if batch and function is None:
        raise ConfigError(f.at("batch"), "applies to processor.function, which is not set")
    parallelism = f.integer("parallelism")
    if parallelism > 1 and function is None:
        raise ConfigError(f.at("parallelism"), "applies to processor.function, which is not set")
    # No default: without them the function runs in the worker's thread, the fast path.
    timeout = f.opt_number("timeoutSeconds")
    memory = f.opt_integer("maxMemoryMiB")
    for key, value in (("timeoutSeconds", timeout), ("maxMemoryMiB", memory)):
        if value is not None and function is None:
            where = " (a sidecar's is processor.container.timeoutSeconds)" if container else ""
            raise ConfigError(f.at(key), f"applies to processor.function, which is not set{where}")
    if inject and container is None:
        raise ConfigError(
            f.at("container"),
            "required with spec.mode: inject (the worker delivers to the application container)",
        )
    concurrency = f.integer("concurrency")
    order = cast(Order, f.choice("order"))
    refuse_pool_clashes(
        f,
        concurrency=concurrency,
        lifespan=lifespan,
        parallelism=parallelism,
        timeout=timeout,
        memory=memory,
    )
    f.done()
    return ProcessorSpec(
        function=function,
        container=container,
        batch=batch,
        parallelism=parallelism,
        timeout_seconds=timeout,
        max_memory_mib=memory,
        concurrency=concurrency,
        order=order,
        lifespan=lifespan,
    )


def _sink_kafka(k: Fields, source_registry: SchemaRegistrySpec | None) -> KafkaSinkSpec:
    fmt = cast(SinkFormat, k.choice("format"))
    registry = _schema_registry(k.sub("schemaRegistry")) or source_registry
    s = k.sub("schema")
    schema = None
    if s is not None:
        schema = SinkSchemaSpec(file=s.opt_str("file"), subject=s.opt_str("subject"))
        s.done()
    message = k.opt_str("protobufMessage")
    auto_register = k.flag("autoRegister")
    out = KafkaSinkSpec(
        topic=k.text("topic"),
        # The sink's producer reads the pipeline's Kafka Secret: secrets belong there.
        config=client_config_map(k, "config", "spec.kafka.secretRef"),
        delivery=k.choice("delivery"),
        format=fmt,
        schema=schema,
        protobuf_message=message,
        auto_register=auto_register,
        schema_registry=registry if fmt != "json" else None,
    )
    k.done()
    if fmt == "json":
        given = [n for n in ("schema", "protobufMessage", "schemaRegistry") if k.has(n)]
        if auto_register:
            given.append("autoRegister")
        if given:
            raise ConfigError(k.at(given[0]), "is only for format avro, protobuf or jsonschema")
        return out
    if registry is None:
        raise ConfigError(
            k.at("schemaRegistry"),
            f"is required when format is {fmt} (or set spec.source.schemaRegistry)",
        )
    file = schema.file if schema is not None else None
    if fmt == "protobuf":
        if message is None or ":" not in message:
            raise ConfigError(
                k.at("protobufMessage"),
                "is required when format is protobuf: the generated message class "
                "(module:Class) values are encoded as",
            )
        if file is not None:
            raise ConfigError(
                f"{k.at('schema')}.file", "is not for protobuf: the message class is the schema"
            )
    elif message is not None:
        raise ConfigError(k.at("protobufMessage"), "is only for format protobuf")
    elif schema is None or (file is None and schema.subject is None):
        raise ConfigError(
            k.at("schema"),
            f"is required when format is {fmt}: a schema file, or the subject whose latest "
            "version to encode with",
        )
    elif file is None and auto_register:
        raise ConfigError(k.at("autoRegister"), "needs schema.file: the schema to register")
    return out


def _sink(f: Fields | None, source_registry: SchemaRegistrySpec | None = None) -> SinkSpec:
    assert f is not None
    kinds = [k for k in ("kafka", "spark", "log") if k in f.raw]
    if len(kinds) != 1:
        got = ", ".join(kinds) if kinds else "none"
        raise ConfigError(f.path, f"expected exactly one of kafka, spark, log; got {got}")
    sink = SinkSpec()
    if kinds == ["kafka"]:
        sink = SinkSpec(kafka=_sink_kafka(f.section("kafka"), source_registry))
    elif kinds == ["spark"]:
        sink = SinkSpec(spark=spark_sink(f.section("spark")))
    else:
        log = f.section("log")
        log.done()
        sink = SinkSpec(log=LogSinkSpec())
    f.done()
    return sink


def _commit(f: Fields) -> CommitSpec:
    return f.finish(CommitSpec(interval_seconds=f.number("intervalSeconds")))


def _limits(f: Fields) -> LimitsSpec:
    return f.finish(
        LimitsSpec(
            max_in_flight_messages=f.integer("maxInFlightMessages"),
            max_in_flight_bytes=f.integer("maxInFlightBytes"),
        )
    )


def _errors(f: Fields) -> ErrorsSpec:
    policy = cast(ErrorPolicyName, f.choice("policy"))
    d = f.sub("dlq")
    dlq = None
    if d is not None:
        dlq = DlqSpec(topic=d.text("topic"))
        d.done()
    if policy == "dlq" and dlq is None:
        raise ConfigError(f.at("dlq.topic"), "is required when policy is dlq")
    ordering = cast(Ordering, f.choice("ordering"))
    retry_topics = _retry_topics(f)
    if retry_topics and ordering == "strict":
        raise ConfigError(
            f.path,
            "retryTopics and ordering: strict cannot be combined: a record sent to a retry "
            "topic is overtaken by the records behind it; drop errors.retryTopics to keep "
            "order, or errors.ordering to retry without holding the partition",
        )
    return f.finish(
        ErrorsSpec(
            policy=policy,
            max_retries=f.integer("maxRetries"),
            retry_backoff_seconds=f.number("retryBackoffSeconds"),
            dlq=dlq,
            retry_topics=retry_topics,
            ordering=ordering,
        )
    )


MAX_RETRY_TOPICS = 10


def _retry_topics(f: Fields) -> tuple[RetryTopicSpec, ...]:
    items = f.sub_list("retryTopics")
    if len(items) > MAX_RETRY_TOPICS:
        raise ConfigError(
            f.at("retryTopics"), f"expected at most {MAX_RETRY_TOPICS} entries, got {len(items)}"
        )
    out: list[RetryTopicSpec] = []
    for item in items:
        given = item.opt_integer("delaySeconds")
        item.done()  # first: a misspelt delaySeconds is named as such
        if given is None:
            raise ConfigError(item.at("delaySeconds"), "is required")
        delay = given
        if any(r.delay_seconds == delay for r in out):
            raise ConfigError(
                item.at("delaySeconds"),
                f"{delay} appears twice: each delay names its own topic (<topic>.retry-{delay}s)",
            )
        out.append(RetryTopicSpec(delay_seconds=delay))
    return tuple(out)


def _shutdown(f: Fields) -> ShutdownSpec:
    return f.finish(ShutdownSpec(drain_timeout_seconds=f.number("drainTimeoutSeconds")))


def _metrics(f: Fields) -> MetricsSpec:
    port, probe_port = f.integer("port"), f.integer("probePort")
    if probe_port == port:
        raise ConfigError(
            f.at("probePort"),
            f"must differ from metrics.port ({port}): the probes have a listener of their own",
        )
    return f.finish(MetricsSpec(port=port, probe_port=probe_port))
