"""The pipeline manifest: typed spec and its validating loader."""

from offtake.config._fields import ConfigError
from offtake.config.loader import API_VERSION, KIND, load_pipeline, parse_pipeline, read_manifest
from offtake.config.spec import PipelineSpec

__all__ = [
    "API_VERSION",
    "KIND",
    "ConfigError",
    "PipelineSpec",
    "load_pipeline",
    "parse_pipeline",
    "read_manifest",
]
