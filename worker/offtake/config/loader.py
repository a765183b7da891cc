"""Read a ConsumerPipeline manifest (YAML or JSON) into a :class:`PipelineSpec`.

Every problem raises :class:`ConfigError` naming the field's path, e.g.
``spec.limits.maxInFlightMessages: expected an integer, got the string 'lots'``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from offtake.config._fields import ConfigError, Fields
from offtake.config.redrive import dlq_topic_of, parse_redrive
from offtake.config.spec import (
    CommitSpec,
    ContainerSpec,
    DlqSpec,
    ErrorPolicyName,
    ErrorsSpec,
    Format,
    JdbcSpec,
    KafkaSinkSpec,
    KafkaSpec,
    LimitsSpec,
    LogSinkSpec,
    MetricsSpec,
    Mode,
    Ordering,
    PipelineSpec,
    ProcessorSpec,
    RetryTopicSpec,
    SecretRef,
    ShutdownSpec,
    SinkSpec,
    SourceSpec,
    SparkBatchSpec,
    SparkFormat,
    SparkMode,
    SparkSinkSpec,
    SparkSubmitSpec,
    StartFrom,
)

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
    top = Fields(doc, "")
    api_version = top.text("apiVersion", required=True)
    if api_version != API_VERSION:
        raise ConfigError("apiVersion", f"expected {API_VERSION}, got {api_version!r}")
    top.choice("kind", (KIND,))
    meta = top.sub("metadata", required=True)
    assert meta is not None
    name = meta.text("name", required=True)
    namespace = meta.text("namespace", "default")
    spec = top.sub("spec", required=True)
    assert spec is not None
    top.has("status")  # status is the operator's; a manifest copied from the cluster may carry it
    top._seen.update({"status"})
    mode = spec.choice("mode", MODES, "deployment")
    pipeline = PipelineSpec(
        name=name,
        namespace=namespace,
        kafka=_kafka(spec.sub("kafka", required=True)),
        source=_source(spec.sub("source", required=True), f"{namespace}.{name}"),
        processor=_processor(spec.sub("processor"), inject=mode == "inject"),
        sink=_sink(spec.sub("sink", required=True)),
        commit=_commit(spec.sub("commit")),
        limits=_limits(spec.sub("limits")),
        errors=_errors(spec.sub("errors")),
        shutdown=_shutdown(spec.sub("shutdown")),
        metrics=_metrics(spec.sub("metrics")),
        replicas=spec.integer("replicas", 1, minimum=0, maximum=1000),
        paused=spec.flag("paused", False),
        mode=cast(Mode, mode),
    )
    if pipeline.mode == "inject" and pipeline.paused:
        raise ConfigError(
            "spec.paused",
            "not available with mode: inject (the workers are in the workload's pods: scale "
            "the workload to zero instead)",
        )
    spec._seen.update(_OPERATOR_ONLY_FIELDS)
    spec.done()
    # Not the worker's to act on, but checked here so that a bad request is named by
    # `offtake validate` and by the operator's pass through this loader alike.
    raw_spec = doc["spec"]
    parse_redrive(raw_spec.get("redrive"), dlq_topic_of(raw_spec))
    return pipeline


# Fields the operator acts on and the worker has no use for: accepted, not interpreted here.
_OPERATOR_ONLY_FIELDS = {
    "rewind",
    "redrive",
    "autoscaling",
    "template",
    "resources",
    "image",
    "serviceMonitor",
}

# librdkafka properties that hold a secret: never inline in kafka.config, where they would be
# stored in plain text in the pipeline, its ConfigMap and every copy of the manifest.
_SECRET_SUFFIXES = ("password", "secret")
_SECRET_PROPERTIES = {"sasl.jaas.config", "ssl.key.pem", "ssl_key.pem", "sasl.oauthbearer.config"}


def is_secret_property(key: str) -> bool:
    """Whether a librdkafka property holds a secret (``sasl.password``, ``ssl.key.password``,
    ``sasl.oauthbearer.client.secret``, a private key, ...)."""
    low = key.lower()
    return low.endswith(_SECRET_SUFFIXES) or low in _SECRET_PROPERTIES


def _kafka(f: Fields | None) -> KafkaSpec:
    assert f is not None
    secret = f.sub("secretRef")
    config = f.str_map("config")
    for key in config:
        if is_secret_property(key):
            raise ConfigError(
                f"{f.at('config')}.{key}",
                "is a secret and must not be inline (it would be stored in plain text in the "
                "pipeline and its ConfigMap): put it in a Secret and name that in "
                "spec.kafka.secretRef",
            )
    out = KafkaSpec(
        bootstrap_servers=f.text("bootstrapServers", required=True),
        config=config,
        secret_ref=_secret_ref(secret),
        ca_secret_ref=_secret_ref(f.sub("caSecretRef")),
        connect_timeout_seconds=f.number(
            "connectTimeoutSeconds", 60.0, minimum=1.0, maximum=3600.0
        ),
        group_protocol=(
            f.choice("groupProtocol", GROUP_PROTOCOLS) if f.has("groupProtocol") else None
        ),
        static_membership=f.flag("staticMembership", False),
    )
    if out.group_protocol is not None and "partition.assignment.strategy" in config:
        raise ConfigError(
            f.at("groupProtocol"),
            "set either groupProtocol or kafka.config's partition.assignment.strategy, not both",
        )
    f.done()
    return out


GROUP_PROTOCOLS = ("cooperative-sticky", "range", "roundrobin", "consumer")


def _secret_ref(f: Fields | None) -> SecretRef | None:
    if f is None:
        return None
    out = SecretRef(name=f.text("name", required=True))
    f.done()
    return out


def _source(f: Fields | None, default_group: str) -> SourceSpec:
    assert f is not None
    out = SourceSpec(
        topics=f.str_list("topics", required=True),
        group_id=f.text("groupId", default_group),
        start_from=cast(StartFrom, f.choice("startFrom", ("earliest", "latest"), "earliest")),
        format=cast(Format, f.choice("format", ("json", "string", "bytes"), "json")),
    )
    f.done()
    return out


#: deployment: the operator runs the workers; inject: the worker is injected into the pods of
#: the user's own workload that carry the offtake.dev/pipeline annotation.
MODES = ("deployment", "inject")


def _processor(f: Fields | None, *, inject: bool = False) -> ProcessorSpec:
    if f is None:
        if inject:
            raise ConfigError(
                "spec.processor.container",
                "required with spec.mode: inject (the port the application container listens "
                "on for the sidecar protocol)",
            )
        return ProcessorSpec()
    function = f.opt_str("function")
    if function is not None and (":" not in function or function.startswith(":")):
        raise ConfigError(f.at("function"), f"expected module:callable, got {function!r}")
    c = f.sub("container")
    container = None
    if c is not None:
        image = (c.opt_str("image") or "") if inject else c.text("image", required=True)
        if inject and image:
            raise ConfigError(
                c.at("image"),
                "not used with spec.mode: inject: the application container of each annotated "
                "pod is the processor",
            )
        container = ContainerSpec(
            image=image,
            port=c.integer("port", 8080, minimum=1, maximum=65535),
            path=c.text("path", "/v1/process"),
            timeout_seconds=c.number("timeoutSeconds", 30.0, minimum=0.1),
            max_batch_records=c.integer("maxBatchRecords", 500, minimum=1),
        )
        c._seen.update(
            {"resources", "env", "envFrom", "command", "args", "imagePullPolicy", "securityContext"}
        )
        c.done()
    if function is not None and container is not None:
        raise ConfigError(f.path, "set either function or container, not both")
    if inject and container is None:
        raise ConfigError(
            f.at("container"),
            "required with spec.mode: inject (the worker delivers to the application container)",
        )
    f.done()
    return ProcessorSpec(function=function, container=container)


DELIVERY_MODES = ("at-least-once", "exactly-once")


def _sink(f: Fields | None) -> SinkSpec:
    assert f is not None
    kinds = [k for k in ("kafka", "spark", "log") if k in f.raw]
    if len(kinds) != 1:
        got = ", ".join(kinds) if kinds else "none"
        raise ConfigError(f.path, f"expected exactly one of kafka, spark, log; got {got}")
    sink = SinkSpec()
    if kinds == ["kafka"]:
        k = f.sub("kafka") or Fields({}, f.at("kafka"))
        sink = SinkSpec(
            kafka=KafkaSinkSpec(
                topic=k.text("topic", required=True),
                config=k.str_map("config"),
                delivery=k.choice("delivery", DELIVERY_MODES, "at-least-once"),
            )
        )
        k.done()
    elif kinds == ["spark"]:
        sink = SinkSpec(spark=_spark(f.sub("spark") or Fields({}, f.at("spark"))))
    else:
        log = f.sub("log") or Fields({}, f.at("log"))
        log.done()
        sink = SinkSpec(log=LogSinkSpec())
    f.done()
    return sink


def _spark(f: Fields) -> SparkSinkSpec:
    fmt = f.choice("format", ("parquet", "json", "delta", "jdbc"))
    path = f.opt_str("path")
    j = f.sub("jdbc")
    jdbc = None
    if j is not None:
        jdbc = JdbcSpec(
            url=j.text("url", required=True),
            table=j.text("table", required=True),
            secret_ref=_secret_ref(j.sub("secretRef")),
            user=j.opt_str("user"),
            password=j.opt_str("password"),
        )
        j.done()
    if fmt == "jdbc" and jdbc is None:
        raise ConfigError(f.at("jdbc"), "is required when format is jdbc")
    if fmt != "jdbc" and path is None:
        raise ConfigError(f.at("path"), f"is required when format is {fmt}")
    b = f.sub("batch") or Fields({}, f.at("batch"))
    batch = SparkBatchSpec(
        max_records=b.integer("maxRecords", 100_000, minimum=1),
        max_interval_seconds=b.number("maxIntervalSeconds", 60.0, minimum=0.01),
        max_bytes=b.integer("maxBytes", 134_217_728, minimum=1),
    )
    b.done()
    s = f.sub("submit") or Fields({}, f.at("submit"))
    mode = s.choice("mode", ("local", "connect", "kubernetes"), "local")
    submit = SparkSubmitSpec(
        mode=cast(SparkMode, mode),
        master=s.text("master", "local[*]"),
        connect_url=s.opt_str("connectUrl"),
        conf=s.str_map("conf"),
    )
    s._seen.update({"image", "serviceAccount", "sparkApplication"})
    s.done()
    if mode == "connect" and submit.connect_url is None:
        raise ConfigError(s.at("connectUrl"), "is required when mode is connect")
    out = SparkSinkSpec(
        format=cast(SparkFormat, fmt),
        path=path,
        jdbc=jdbc,
        partition_by=f.str_list("partitionBy"),
        transform=f.opt_str("transform"),
        sql=f.opt_str("sql"),
        batch=batch,
        submit=submit,
        packages=f.str_list("packages"),
    )
    f.done()
    return out


def _commit(f: Fields | None) -> CommitSpec:
    if f is None:
        return CommitSpec()
    out = CommitSpec(interval_seconds=f.number("intervalSeconds", 1.0, minimum=0.01, maximum=3600))
    f.done()
    return out


def _limits(f: Fields | None) -> LimitsSpec:
    if f is None:
        return LimitsSpec()
    out = LimitsSpec(
        max_in_flight_messages=f.integer("maxInFlightMessages", 10_000, minimum=1),
        max_in_flight_bytes=f.integer("maxInFlightBytes", 67_108_864, minimum=1024),
    )
    f.done()
    return out


def _errors(f: Fields | None) -> ErrorsSpec:
    if f is None:
        return ErrorsSpec()
    # The default is stop: without an explicit choice, a failing record is never lost.
    policy = cast(ErrorPolicyName, f.choice("policy", ("dlq", "skip", "stop"), "stop"))
    d = f.sub("dlq")
    dlq = None
    if d is not None:
        dlq = DlqSpec(topic=d.text("topic", required=True))
        d.done()
    if policy == "dlq" and dlq is None:
        raise ConfigError(f.at("dlq.topic"), "is required when policy is dlq")
    ordering = cast(Ordering, f.choice("ordering", ("relaxed", "strict"), "relaxed"))
    retry_topics = _retry_topics(f)
    if retry_topics and ordering == "strict":
        raise ConfigError(
            f.path,
            "retryTopics and ordering: strict cannot be combined: a record sent to a retry "
            "topic is overtaken by the records behind it; drop errors.retryTopics to keep "
            "order, or errors.ordering to retry without holding the partition",
        )
    out = ErrorsSpec(
        policy=policy,
        max_retries=f.integer("maxRetries", 3, minimum=0, maximum=100),
        retry_backoff_seconds=f.number("retryBackoffSeconds", 0.5, minimum=0.0, maximum=3600),
        dlq=dlq,
        retry_topics=retry_topics,
        ordering=ordering,
    )
    f.done()
    return out


MAX_RETRY_TOPICS = 10
MAX_RETRY_DELAY_SECONDS = 604_800  # a week; the retry topic's retention must exceed it


def _retry_topics(f: Fields) -> tuple[RetryTopicSpec, ...]:
    items = f.sub_list("retryTopics")
    if len(items) > MAX_RETRY_TOPICS:
        raise ConfigError(
            f.at("retryTopics"), f"expected at most {MAX_RETRY_TOPICS} entries, got {len(items)}"
        )
    out: list[RetryTopicSpec] = []
    for item in items:
        delay = item.integer("delaySeconds", 0, minimum=1, maximum=MAX_RETRY_DELAY_SECONDS)
        item.done()  # first: a misspelt delaySeconds is named as such
        if not item.has("delaySeconds"):
            raise ConfigError(item.at("delaySeconds"), "is required")
        if any(r.delay_seconds == delay for r in out):
            raise ConfigError(
                item.at("delaySeconds"),
                f"{delay} appears twice: each delay names its own topic (<topic>.retry-{delay}s)",
            )
        out.append(RetryTopicSpec(delay_seconds=delay))
    return tuple(out)


def _shutdown(f: Fields | None) -> ShutdownSpec:
    if f is None:
        return ShutdownSpec()
    out = ShutdownSpec(drain_timeout_seconds=f.number("drainTimeoutSeconds", 25.0, minimum=0.0))
    f.done()
    return out


def _metrics(f: Fields | None) -> MetricsSpec:
    if f is None:
        return MetricsSpec()
    out = MetricsSpec(port=f.integer("port", 9100, minimum=0, maximum=65535))
    f.done()
    return out
