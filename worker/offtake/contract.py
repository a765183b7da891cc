"""The worker's side of its seam with the operator and the ``kubectl offtake`` plugin.

The operator (``offtake_operator``) imports the worker through this module only (an
import-linter contract in pyproject.toml): reading and checking a pipeline the way the worker
will, the CRD's schema and defaults (for the fields only the operator reads), the client
properties the operator's own Kafka clients use, reading lag and group positions, the names
of the headers and metrics the worker writes, decoding a dead letter as the worker decoded it,
a redrive's request and progress, and the Spark Connect children the worker expects in mode
kubernetes. Everything here is defined where the worker uses it; this module only names what
crosses the seam, so a change to anything else stays inside the worker.
"""

from __future__ import annotations

from offtake.config import (
    OPERATOR_ONLY_FIELDS,
    ConfigError,
    PipelineSpec,
    RedriveRequest,
    parse_pipeline,
    parse_redrive,
    redrive_group,
)
from offtake.config._fields import with_defaults
from offtake.config.client_properties import operator_client_properties, refused_reason
from offtake.config.crd_check import crd_node
from offtake.config.redrive import dlq_topic_of
from offtake.config.secret_env import secret_envs
from offtake.config.spec import is_topic_pattern, matching_topics
from offtake.engine.dead_letters import header, read_origin
from offtake.engine.header_values import HeaderError, read_int
from offtake.formats.base import Decoder
from offtake.formats.errors import DecodeError
from offtake.formats.resolve import decoder_for
from offtake.headers import H_ATTEMPTS, H_ERROR_CLASS, H_ERROR_MESSAGE, H_STAGE
from offtake.kafka.config import client_config
from offtake.kafka.group_view import PartitionPosition, group_positions
from offtake.kafka.oldest_record import read_timestamps
from offtake.kafka.protocols import ConsumerLike
from offtake.metrics import LAG_MESSAGES_METRIC, LAG_SECONDS_METRIC, SHARE_BACKLOG_METRIC
from offtake.records import TopicPartition
from offtake.redact import redact
from offtake.redrive import RedriveResult, read_progress
from offtake.sinks.spark import kubernetes as spark_kubernetes

__all__ = [
    "H_ATTEMPTS",
    "H_ERROR_CLASS",
    "H_ERROR_MESSAGE",
    "H_STAGE",
    "LAG_MESSAGES_METRIC",
    "LAG_SECONDS_METRIC",
    "OPERATOR_ONLY_FIELDS",
    "SHARE_BACKLOG_METRIC",
    "ConfigError",
    "ConsumerLike",
    "DecodeError",
    "Decoder",
    "HeaderError",
    "PartitionPosition",
    "PipelineSpec",
    "RedriveRequest",
    "RedriveResult",
    "TopicPartition",
    "client_config",
    "crd_node",
    "decoder_for",
    "dlq_topic_of",
    "group_positions",
    "header",
    "is_topic_pattern",
    "matching_topics",
    "operator_client_properties",
    "parse_pipeline",
    "parse_redrive",
    "read_int",
    "read_origin",
    "read_progress",
    "read_timestamps",
    "redact",
    "redrive_group",
    "refused_reason",
    "secret_envs",
    "spark_kubernetes",
    "with_defaults",
]
