"""Names shared by the operator's modules: the resource, labels, annotations, child names."""

from __future__ import annotations

GROUP = "offtake.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ConsumerPipeline"
PLURAL = "consumerpipelines"

#: The label every child and every worker pod carries; the Deployment's selector.
PIPELINE_LABEL = f"{GROUP}/pipeline"
#: Which part of a pipeline a child object is (worker, metrics, config, ...).
COMPONENT_LABEL = f"{GROUP}/component"
MANAGED_BY = "offtake-operator"

#: Pod annotation with the sha256 of the rendered pipeline.yaml: a new value rolls the pods.
CHECKSUM_ANNOTATION = f"{GROUP}/config-checksum"

#: Child annotation: checksum of the rendering last applied (see offtake_operator.apply).
APPLIED_ANNOTATION = f"{GROUP}/applied"

#: Where the worker finds its manifest, and the key in the ConfigMap.
CONFIG_DIR = "/etc/offtake"
CONFIG_KEY = "pipeline.yaml"
PIPELINE_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
#: The worker reads one librdkafka property per file here (offtake.kafka.config).
KAFKA_SECRET_DIR = f"{CONFIG_DIR}/kafka-secret"
#: The Spark JDBC sink's credentials (keys user and password), when sink.spark.jdbc.secretRef.
JDBC_SECRET_DIR = f"{CONFIG_DIR}/jdbc-secret"
#: Schema registry credentials: one folder per Secret named by source.schemaRegistry.secretRef
#: or sink.kafka.schemaRegistry.secretRef (offtake.schema_registry reads <dir>/<name>/).
SCHEMA_REGISTRY_SECRETS_DIR = f"{CONFIG_DIR}/schema-registry-secrets"

#: On a redrive Job: the id of the redrive it runs (spec.redrive.id).
REDRIVE_ID_ANNOTATION = f"{GROUP}/redrive-id"
#: The label of a redrive Job's pods (not PIPELINE_LABEL: they are not workers).
REDRIVE_LABEL = f"{GROUP}/redrive"
#: A finished redrive Job (and its pods, with their logs) is kept this long, then the Job
#: controller deletes it. Long enough to read a failure; the status keeps the totals. A failed
#: Job deleted this way is created again for the same id while it is pending (a daily retry
#: that resumes from the redrive group's commits).
REDRIVE_JOB_TTL_SECONDS = 24 * 3600

WORKER_CONTAINER = "worker"
REDRIVE_CONTAINER = "redrive"
PROCESSOR_CONTAINER = "processor"
METRICS_PORT_NAME = "metrics"
#: The worker's probe listener (spec.metrics.probePort): the kubelet's probes, nothing else.
PROBE_PORT_NAME = "probes"
PROCESSOR_PORT_NAME = "processor"

#: Grace on top of spec.shutdown.drainTimeoutSeconds: flushing, the final commit, leaving the group.
GRACE_EXTRA_SECONDS = 15


def deployment_name(pipeline: str) -> str:
    return pipeline


def configmap_name(pipeline: str) -> str:
    return f"{pipeline}-pipeline"


def service_name(pipeline: str) -> str:
    return f"{pipeline}-metrics"


def pdb_name(pipeline: str) -> str:
    return pipeline


def autoscaler_name(pipeline: str) -> str:
    return pipeline


def slo_rule_name(pipeline: str) -> str:
    return f"{pipeline}-slo"


def redrive_job_name(pipeline: str) -> str:
    # At most 55 + 8 = 63 characters: a Job's name is also its pods' job-name label value.
    return f"{pipeline}-redrive"


def selector(pipeline: str) -> dict[str, str]:
    return {PIPELINE_LABEL: pipeline}


def selector_string(pipeline: str) -> str:
    return f"{PIPELINE_LABEL}={pipeline}"


#: Pod annotation naming the pipeline whose worker the webhook injects (spec.mode: inject).
#: The same key as PIPELINE_LABEL: the webhook also sets the label, which status and the
#: metrics Service select by.
INJECT_ANNOTATION = f"{GROUP}/pipeline"
#: Optional pod annotation: which container is the application (default: the first one).
APP_CONTAINER_ANNOTATION = f"{GROUP}/container"
#: Set by the webhook on the pods it patched: the pipeline's config checksum at injection.
INJECTED_ANNOTATION = f"{GROUP}/injected"
#: Label of the pods the webhook patched: the operator watches only these pods (server-side
#: selected), never the workers of its own Deployments.
INJECTED_LABEL = f"{GROUP}/injected"
#: The injected worker's container name (not "worker": the user's pod may have one).
INJECTED_CONTAINER = "offtake-worker"
#: Prefix of the injected volumes' names, apart from the user's own.
INJECTED_VOLUME_PREFIX = "offtake-"


def injected_selector_string(pipeline: str) -> str:
    """The pods carrying ``pipeline``'s injected worker."""
    return f"{PIPELINE_LABEL}={pipeline},{INJECTED_LABEL}"
