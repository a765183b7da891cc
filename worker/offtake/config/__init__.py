"""The pipeline manifest: typed spec and its validating loader."""

from offtake.config._fields import ConfigError
from offtake.config.loader import (
    API_VERSION,
    KIND,
    OPERATOR_ONLY_FIELDS,
    load_pipeline,
    parse_pipeline,
    read_manifest,
)
from offtake.config.redrive import RedriveRequest, parse_redrive, parse_until, redrive_group
from offtake.config.spec import PipelineSpec

__all__ = [
    "API_VERSION",
    "KIND",
    "OPERATOR_ONLY_FIELDS",
    "ConfigError",
    "PipelineSpec",
    "RedriveRequest",
    "load_pipeline",
    "parse_pipeline",
    "parse_redrive",
    "parse_until",
    "read_manifest",
    "redrive_group",
]
