"""The pipeline's schema registry client: confluent-kafka's own, configured from the spec;
shared by the source's decoders (processing) and the Kafka sink's encoders (sinks).

Credentials come from the registry's ``secretRef``, which the operator mounts as files (like
the Kafka Secret) in ``<SECRET_DIR>/<secret name>/``: ``username`` and ``password`` for basic
auth, ``ca.crt`` to verify the registry's certificate, ``tls.crt`` and ``tls.key`` for a client
certificate. Nothing secret is ever part of the spec, its ConfigMap or a log line.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from offtake import environment
from offtake.config.spec import SchemaRegistrySpec

SECRET_DIR = "/etc/offtake/schema-registry-secrets"
SECRET_DIR_ENV = environment.REGISTRY_SECRET_DIR_ENV
# Our own backoff decides how long an outage is retried (RegistryUnavailable); the client's
# built-in retries would only make each attempt block longer.
_CLIENT_RETRIES = 0
_TIMEOUT_S = 10


def registry_config(spec: SchemaRegistrySpec, secret_dir: str | None = None) -> dict[str, Any]:
    """SchemaRegistryClient's configuration: the URL and what the mounted Secret holds.

    ``secret_dir``: the folder holding one folder per Secret (default SECRET_DIR, or the
    environment's OFFTAKE_SCHEMA_REGISTRY_SECRETS_DIR for a local run)."""
    conf: dict[str, Any] = {
        "url": spec.url,
        "max.retries": _CLIENT_RETRIES,
        "timeout": _TIMEOUT_S,
    }
    if spec.secret_ref is None:
        return conf
    folder = environment.directory(SECRET_DIR_ENV, SECRET_DIR, secret_dir)
    path = folder / spec.secret_ref.name
    if not path.is_dir():
        raise ValueError(
            f"schemaRegistry.secretRef {spec.secret_ref.name!r}: no mounted Secret at {path}"
        )
    user, password = path / "username", path / "password"
    if user.is_file() and password.is_file():
        conf["basic.auth.user.info"] = f"{_text(user)}:{_text(password)}"
    if (path / "ca.crt").is_file():
        conf["ssl.ca.location"] = str(path / "ca.crt")
    if (path / "tls.crt").is_file() and (path / "tls.key").is_file():
        conf["ssl.certificate.location"] = str(path / "tls.crt")
        conf["ssl.key.location"] = str(path / "tls.key")
    return conf


def make_client(spec: SchemaRegistrySpec, secret_dir: str | None = None) -> SchemaRegistryClient:
    # The client's HTTP library logs every request at INFO: one line per schema lookup would
    # drown the worker's own log; its warnings and errors still come through.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return SchemaRegistryClient(registry_config(spec, secret_dir))


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


def load_message_class(path: str) -> Any:
    """The generated protobuf message class named ``module:Class``."""
    module_name, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"source.protobufMessage {path!r}: cannot load it: {exc}") from None
    if not hasattr(cls, "DESCRIPTOR"):
        raise ValueError(f"source.protobufMessage {path!r}: not a generated protobuf message")
    return cls


def is_outage(exc: BaseException) -> bool:
    """Whether a registry call failed for a reason that is not the record's: a transport
    error (refused, timed out, reset, a TLS handshake that failed), a 5xx / 429 answer, or a
    401 / 403 (credentials refused). A caller that can ask the registry whether the refusal is
    the one id's (formats.wire, :func:`answers_listing`) asks :func:`is_refusal` first."""
    if isinstance(exc, SchemaRegistryError):
        status = exc.http_status_code
        return status is None or status < 0 or status >= 500 or is_refusal(exc)
    # httpx's transport errors, whatever the client's HTTP library version calls them.
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"TransportError", "TimeoutException", "NetworkError", "OSError"})


def is_refusal(exc: BaseException) -> bool:
    """Whether the registry answered 401 or 403: this request refused, for a reason its answer
    alone does not tell (credentials refused everywhere, or this one schema not readable)."""
    return isinstance(exc, SchemaRegistryError) and exc.http_status_code in (401, 403)


def answers_listing(client: SchemaRegistryClient) -> bool:
    """Whether the registry answers this client's subject listing (``GET /subjects``, never
    cached by the client): the request every principal allowed to read any schema may make.

    The rule that tells a refused schema id from a refused client: after a 401/403 for one id,
    the listing answered means the registry takes these credentials and refused only that
    id (the record's fault: dead-lettered per the policy, reason ``schema-id-refused``);
    the listing refused too (401/403), unreachable or 5xx means it refuses everything this
    worker would ask: an outage (records wait). Raises what an outage raises (the caller
    sorts it with :func:`is_outage`); returns False for a refusal."""
    try:
        client.get_subjects()
    except Exception as exc:
        if is_refusal(exc):
            return False
        raise
    return True
