"""The Kafka credentials of a pipeline: its ``spec.kafka.secretRef`` Secret, mapped to
librdkafka properties.

Two shapes of Secret work as they are:

- keys that are librdkafka security properties (``sasl.username``, ``sasl.password``,
  ``ssl.key.pem``, ...), one property per key;
- Strimzi's: a ``KafkaUser`` Secret (SCRAM-SHA-512: ``password`` and ``sasl.jaas.config``;
  TLS: ``user.crt``, ``user.key``, ``ca.crt``, ``user.p12``, ``user.password``) or a cluster CA
  Secret (``ca.crt``, ``ca.p12``, ``ca.password``). Their keys are renamed to the properties
  librdkafka reads (PEM contents, since the PKCS#12 files are Java's), the SCRAM user name is
  read from ``sasl.jaas.config``, and the keys librdkafka has no use for are left out (also a
  KafkaUser's ``ca.crt``: that is the clients CA, not the one that signed the brokers).

The cluster CA usually lives in a Secret of its own: ``spec.kafka.caSecretRef`` names it, and
its ``ca.crt`` becomes ``ssl.ca.pem`` next to the user's credentials.

Any other key is refused, naming it: a key passed through as a property would make every
client fail with ``No such configuration property``, far from the Secret that caused it.

The workers get the same properties: the Secret is mounted with ``items`` that give each key
its property's name as file name (the worker reads one property per file), and the user name,
which is not secret, goes into the pipeline's ConfigMap.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from offtake.contract import PipelineSpec, refused_reason

from .kubeapi import SECRETS, KubeApi
from .lag import KafkaAccessError

#: Strimzi's key -> the librdkafka property holding the same content.
STRIMZI_KEYS = {
    "password": "sasl.password",  # KafkaUser, SCRAM-SHA-512
    "user.crt": "ssl.certificate.pem",  # KafkaUser, TLS client authentication
    "user.key": "ssl.key.pem",
    "ca.crt": "ssl.ca.pem",  # the cluster CA Secret (<cluster>-cluster-ca-cert)
}
#: A KafkaUser TLS Secret's ca.crt is the *clients* CA (brokers check clients with it); a client
#: checks the brokers with the *cluster* CA, so that ca.crt is no use to librdkafka.
_KAFKAUSER_TLS_KEYS = {"user.crt", "user.key"}
#: Strimzi's keys with nothing for librdkafka: Java keystores and their passwords. The JAAS
#: line only gives the user name (read below); its password is the ``password`` key.
STRIMZI_UNUSED = {"user.p12", "user.password", "ca.p12", "ca.password", "sasl.jaas.config"}
#: Property names a Secret may carry as they are: the security settings of librdkafka.
PROPERTY_PREFIXES = ("sasl.", "ssl.")
PROPERTY_NAMES = {"security.protocol"}

_JAAS_USERNAME = re.compile(r"""\busername\s*=\s*["']([^"']+)["']""")


class KafkaSecretError(KafkaAccessError):
    """The Secret is missing or has a key that maps to no librdkafka property."""


@dataclass(frozen=True)
class KafkaSecret:
    """How the pipeline's Secrets become librdkafka properties."""

    #: (Secret name, its key -> property name), one per Secret: the workers' secret directory
    #: holds each property as a file of that name.
    mounts: tuple[tuple[str, dict[str, str]], ...] = ()
    #: Properties derived from the Secret that are not secret (the SCRAM user name): they go
    #: into the pipeline's ConfigMap, because a mounted key cannot be parsed on the way.
    plain: dict[str, str] = field(default_factory=dict)
    #: Every property, for the operator's own admin clients (lag, rewind).
    properties: dict[str, str] = field(default_factory=dict)


def map_secret(namespace: str, name: str, data: Mapping[str, str]) -> KafkaSecret:
    """Properties from a Secret's decoded ``data``; raise KafkaSecretError naming a bad key."""
    where = f"spec.kafka.secretRef: Secret {namespace}/{name}"
    files: dict[str, str] = {}
    plain: dict[str, str] = {}
    kafkauser_tls = bool(_KAFKAUSER_TLS_KEYS & set(data))
    for key in sorted(data):
        if key == "ca.crt" and kafkauser_tls:
            continue
        if key in STRIMZI_KEYS:
            files[key] = STRIMZI_KEYS[key]
        elif key in STRIMZI_UNUSED:
            continue
        elif refused_reason(key, data[key]) is not None:
            # ssl.engine.location, sasl.kerberos.kinit.cmd, ...: the operator's own clients
            # and the workers would load code or run a command from a tenant's Secret.
            raise KafkaSecretError(
                f"{where} key {key!r} is refused: {refused_reason(key, data[key])}"
            )
        elif key.startswith(PROPERTY_PREFIXES) or key in PROPERTY_NAMES:
            files[key] = key
        else:
            raise KafkaSecretError(
                f"{where} key {key!r} is neither a librdkafka security property (sasl.*, ssl.*, "
                "security.protocol) nor a Strimzi KafkaUser or cluster CA key"
            )
    taken: dict[str, str] = {}
    for key, prop in files.items():
        if prop in taken:
            raise KafkaSecretError(f"{where} keys {taken[prop]!r} and {key!r} both set {prop}")
        taken[prop] = key
    jaas = data.get("sasl.jaas.config")
    if jaas is not None and "sasl.username" not in taken:
        found = _JAAS_USERNAME.search(jaas)
        if found is None:
            raise KafkaSecretError(f"{where} key 'sasl.jaas.config' names no username")
        plain["sasl.username"] = found.group(1)
    properties = {prop: data[key] for key, prop in files.items()}
    properties.update(plain)
    return KafkaSecret(((name, files),), plain, properties)


def with_cluster_ca(
    secret: KafkaSecret | None, namespace: str, name: str, data: Mapping[str, str]
) -> KafkaSecret:
    """``secret`` plus the cluster CA of ``spec.kafka.caSecretRef`` (its ``ca.crt``)."""
    where = f"spec.kafka.caSecretRef: Secret {namespace}/{name}"
    if "ca.crt" not in data:
        raise KafkaSecretError(f"{where} has no key 'ca.crt'")
    base = secret or KafkaSecret()
    if "ssl.ca.pem" in base.properties:
        raise KafkaSecretError(
            f"{where}: spec.kafka.secretRef already sets ssl.ca.pem; keep one of the two"
        )
    return KafkaSecret(
        (*base.mounts, (name, {"ca.crt": "ssl.ca.pem"})),
        base.plain,
        {**base.properties, "ssl.ca.pem": data["ca.crt"]},
    )


async def _read(api: KubeApi, namespace: str, name: str, field: str) -> dict[str, str]:
    secret = await api.get(SECRETS, namespace, name)
    if secret is None:
        raise KafkaSecretError(f"{field}: Secret {namespace}/{name} not found")
    data: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            if key in STRIMZI_UNUSED:
                # Strimzi's PKCS#12 keystores (user.p12, ca.p12) are binary: they are left
                # out anyway, and refusing them would refuse every Strimzi Secret as it is.
                data[key] = ""
                continue
            raise KafkaSecretError(
                f"{field}: Secret {namespace}/{name} key {key!r} is not UTF-8 text"
            ) from None
    return data


async def read_kafka_secret(
    api: KubeApi, namespace: str, pipeline: PipelineSpec
) -> KafkaSecret | None:
    """``spec.kafka.secretRef`` and ``caSecretRef`` mapped to properties (None without them)."""
    ref, ca_ref = pipeline.kafka.secret_ref, pipeline.kafka.ca_secret_ref
    secret = None
    if ref is not None:
        data = await _read(api, namespace, ref.name, "spec.kafka.secretRef")
        secret = map_secret(namespace, ref.name, data)
    if ca_ref is not None:
        data = await _read(api, namespace, ca_ref.name, "spec.kafka.caSecretRef")
        secret = with_cluster_ca(secret, namespace, ca_ref.name, data)
    return secret


async def kafka_properties(api: KubeApi, namespace: str, pipeline: PipelineSpec) -> dict[str, str]:
    """The Secret's properties for the operator's own Kafka clients ({} without a Secret)."""
    secret = await read_kafka_secret(api, namespace, pipeline)
    return {} if secret is None else dict(secret.properties)
