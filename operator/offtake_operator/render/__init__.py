"""Pure functions from a ConsumerPipeline to the child objects that run it, one module per
child kind (as CloudNativePG's pkg/specs): metadata and labels (:mod:`.metadata`), the worker's
configuration document and its ConfigMap (:mod:`.worker_config`), the pod's parts
(:mod:`.pod`, shared with the admission webhook's injected worker), the Deployment, the redrive
Job, the metrics Service, the PodDisruptionBudget, the ServiceMonitor, Spark Connect, the HPA,
KEDA and the choice between them (:mod:`.autoscaler`), the SLO rules, the workers'
NetworkPolicy and their probe listener.

Nothing here talks to the API: the same input always renders the same dicts, which is what
makes reconciling level-based (render, compare, patch the difference) and easy to test. This
module only gathers the names the operator's passes use; each is defined in its kind's module.
"""

from .autoscaler import scaling_reason, wanted_autoscaler
from .deployment import desired_worker_replicas, render_deployment
from .hpa import render_hpa
from .keda import (
    KEDA_AUTH_PARAMETERS,
    keda_security,
    render_scaled_object,
    render_trigger_authentication,
    uses_scaled_object,
)
from .metadata import JSON, checksum, child_metadata, labels, meta, owner_reference
from .pdb import render_pdb
from .pod import (
    POD_SETTINGS,
    check_pod_template,
    check_security,
    copy_pod_settings,
    grace_period_seconds,
    http_probe,
    jdbc_secret_name,
    pod_volumes,
    processor_container,
    schema_registry_secrets,
    secret_key_env,
    security_contexts,
    worker_container,
    worker_env,
    worker_mounts,
    worker_resources,
)
from .redrive_job import render_redrive_job
from .scaling import behavior, lag_seconds_query, replica_bounds, replica_cap, scale_target
from .service import render_service
from .service_monitor import render_service_monitor
from .slo_rules import render_prometheus_rule
from .spark_connect import (
    owned_token,
    render_spark_connect,
    render_spark_connect_token,
    render_spark_network_policies,
    uses_spark_connect,
)
from .worker_config import (
    DEPLOYMENT_ONLY_FIELDS,
    pipeline_document,
    pipeline_yaml,
    render_configmap,
)
from .worker_network_policy import policy_name, worker_network_policies

__all__ = [
    "DEPLOYMENT_ONLY_FIELDS",
    "JSON",
    "KEDA_AUTH_PARAMETERS",
    "POD_SETTINGS",
    "behavior",
    "check_pod_template",
    "check_security",
    "checksum",
    "child_metadata",
    "copy_pod_settings",
    "desired_worker_replicas",
    "grace_period_seconds",
    "http_probe",
    "jdbc_secret_name",
    "keda_security",
    "labels",
    "lag_seconds_query",
    "meta",
    "owned_token",
    "owner_reference",
    "pipeline_document",
    "pipeline_yaml",
    "pod_volumes",
    "policy_name",
    "processor_container",
    "render_configmap",
    "render_deployment",
    "render_hpa",
    "render_pdb",
    "render_prometheus_rule",
    "render_redrive_job",
    "render_scaled_object",
    "render_service",
    "render_service_monitor",
    "render_spark_connect",
    "render_spark_connect_token",
    "render_spark_network_policies",
    "render_trigger_authentication",
    "replica_bounds",
    "replica_cap",
    "scale_target",
    "scaling_reason",
    "schema_registry_secrets",
    "secret_key_env",
    "security_contexts",
    "uses_scaled_object",
    "uses_spark_connect",
    "wanted_autoscaler",
    "worker_container",
    "worker_env",
    "worker_mounts",
    "worker_network_policies",
    "worker_resources",
]
