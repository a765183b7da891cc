"""Which client properties a pipeline may set, which it must keep in a Secret, and which the
operator's own Kafka clients use.

A pipeline's author is a tenant: whatever a ``config`` map says reaches librdkafka in the
worker, and (for ``spec.kafka.config``) in the operator, which is privileged and shared. Three
rules, each checked by the CRD (CEL), by ``offtake validate`` and by the loader:

- **Nothing that loads code or runs a command** (:func:`refused_reason`), in any ``config``
  map and in the Kafka Secret, worker or operator: librdkafka's ``plugin.library.paths``
  (dlopen), ``ssl.engine.location``/``ssl.engine.id`` (an OpenSSL engine, a shared object),
  ``ssl.providers`` (OpenSSL 3 providers, shared objects), ``sasl.kerberos.kinit.cmd`` (a
  shell command), every callback and pointer property (``*_cb``, ``opaque``, ``interceptors``,
  ``default_topic_conf``, ``msg_order_cmp``, ``ssl_engine_callback_data``, ``ssl_key``,
  ``ssl_certificate``, ``ssl_ca``: set only through librdkafka's C API, never meaningful as
  text) and confluent-kafka's Python-level hooks (``logger``, ``on_delivery``, ``on_commit``,
  ``error_cb``, ``oauth_cb``, ...). ``sasl.kerberos.principal`` and ``sasl.kerberos.keytab``
  are substituted into librdkafka's default kinit command line (``kinit -t
  "%{sasl.kerberos.keytab}" -k %{sasl.kerberos.principal}``, run by a shell), so their values
  are held to characters a shell does not interpret (:data:`SHELL_SAFE_VALUE`).
- **No secrets inline** (:func:`is_secret_property`): they would be stored in plain text in the
  pipeline and its ConfigMap, readable with ``view``.
- **The operator's clients use an allowlist** (:func:`operator_client_properties`): connection
  and security settings only. Properties that read local files (``*.location``,
  ``sasl.oauthbearer.assertion.*.file``), reach for the pod's cloud identity
  (``sasl.oauthbearer.metadata.authentication.type``) or start Kerberos are the worker's
  business, in the tenant's own pod, never the operator's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# --------------------------------------------------------------- refused: code and commands

#: Property -> why it is refused (lower case; librdkafka's names are case-sensitive, but a
#: refusal must not be dodged by spelling).
REFUSED_PROPERTIES: dict[str, str] = {
    "plugin.library.paths": "loads shared libraries into the client",
    "interceptors": "installs interceptor code (librdkafka's C API only)",
    "ssl.engine.location": "loads an OpenSSL engine (a shared library)",
    "ssl.engine.id": "selects an OpenSSL engine to load",
    "ssl.providers": "loads OpenSSL providers (shared libraries)",
    "ssl_engine_callback_data": "is a pointer for engine code (librdkafka's C API only)",
    "sasl.kerberos.kinit.cmd": "is a shell command the client runs",
    "opaque": "is a pointer handed to callbacks (librdkafka's C API only)",
    "default_topic_conf": "is a C object (librdkafka's C API only)",
    "msg_order_cmp": "is a C function (librdkafka's C API only)",
    "ssl_key": "is a C object (librdkafka's C API only; use ssl.key.pem in the Secret)",
    "ssl_certificate": "is a C object (librdkafka's C API only; use ssl.certificate.pem)",
    "ssl_ca": "is a C object (librdkafka's C API only; use ssl.ca.pem)",
    # confluent-kafka's Python-level settings: callables (and the logger Offtake sets itself).
    "logger": "is the client's Python logger, which Offtake sets",
    "on_delivery": "is a Python callback",
    "on_commit": "is a Python callback",
}
#: Callbacks: librdkafka's (error_cb, dr_msg_cb, ssl.certificate.verify_cb, ...) and
#: confluent-kafka's (stats_cb, oauth_cb, throttle_cb, ...).
CALLBACK_SUFFIX = "_cb"
#: Values substituted into librdkafka's default ``sasl.kerberos.kinit.cmd`` shell line.
SHELL_SUBSTITUTED = ("sasl.kerberos.principal", "sasl.kerberos.keytab")
#: A principal (``client/host.example.com@EXAMPLE.COM``) or a keytab path: nothing a shell reads
#: as syntax (quotes, spaces, ``;``, ``|``, ``$``, backticks, ...).
SHELL_SAFE_VALUE = r"^[A-Za-z0-9._/@:+=-]+$"


def refused_reason(key: str, value: object = "") -> str | None:
    """Why ``key`` (with ``value``) must not reach a client, or None if it may."""
    low = key.lower()
    if low in REFUSED_PROPERTIES:
        return REFUSED_PROPERTIES[low]
    if low.endswith(CALLBACK_SUFFIX):
        return "is a callback (code), not a setting"
    # Exact names here: librdkafka's names are case-sensitive (another spelling is "No such
    # configuration property"), and the CRD's rule looks these two up rather than walking
    # every value, which would exceed the API server's CEL cost budget.
    if key in SHELL_SUBSTITUTED and not re.fullmatch(SHELL_SAFE_VALUE, str(value)):
        return (
            "is put into librdkafka's kinit shell command: only letters, digits and "
            ". _ / @ : + = - are allowed"
        )
    return None


# --------------------------------------------------------------- what a share consumer refuses

#: Queue mode (spec.source.groupType share): client properties a share consumer refuses or
#: ignores -> what the share group uses instead. Taken from librdkafka's rdkafka_conf.c
#: (rd_kafka_conf_finalize's share-consumer checks, and the property docs that say "ignored for
#: share consumers"), 2.15/2.16; tests/worker/test_share_consumer_properties_on_kafka.py
#: creates a real share consumer with each refused one to keep the list honest. Exact names:
#: librdkafka's names are case-sensitive (another spelling is "No such configuration
#: property" for every client anyway).
SHARE_REFUSED: dict[str, str] = {
    "session.timeout.ms": "sessions are timed by the group config "
    "share.session.timeout.ms (broker: group.share.session.timeout.ms)",
    "heartbeat.interval.ms": "heartbeats are paced by the group config "
    "share.heartbeat.interval.ms (broker: group.share.heartbeat.interval.ms)",
    "group.protocol": "nothing: a share consumer always speaks the share group protocol "
    "(spec.source.groupType chooses it)",
    "group.protocol.type": "nothing: a share consumer always speaks the share group protocol "
    "(spec.source.groupType chooses it)",
    "partition.assignment.strategy": "nothing: the broker assigns the partitions of a share group "
    "(broker config group.share.assignors, group config share.assignment.interval.ms)",
    "group.remote.assignor": "nothing: the broker assigns the partitions of a share group "
    "(broker config group.share.assignors)",
    "group.instance.id": "nothing: share groups have no static membership",
    "enable.auto.commit": "nothing: Offtake acknowledges each record explicitly (ACCEPT, "
    "RELEASE, REJECT)",
    "isolation.level": "the group config share.isolation.level",
    "auto.offset.reset": "spec.source.startFrom (the worker sets the group config "
    "share.auto.offset.reset from it)",
    "queued.min.messages": "nothing: the broker bounds what a share group acquires (group "
    "config share.partition.max.record.locks)",
    "queued.max.messages.kbytes": "nothing: the broker bounds what a share group acquires "
    "(group config share.partition.max.record.locks)",
    "fetch.queue.backoff.ms": "nothing: a share consumer fetches when its last poll is "
    "acknowledged",
    "fetch.error.backoff.ms": "nothing (librdkafka has no such backoff for share consumers)",
    "enable.partition.eof": "nothing: a share group has no partition end to report",
    "message.copy.max.bytes": "nothing for the share consumer (for the producer of the sink, set "
    "it in spec.sink.kafka.config)",
    "topic.blacklist": "nothing: list the topics in spec.source.topics",
    "allow.auto.create.topics": "nothing: create the topics before the pipeline starts",
    "consume.callback.max.messages": "nothing (a share consumer has no consume callback)",
    "socket.max.fails": "nothing: librdkafka fixes it at 1 for share consumers",
}
#: Accepted by librdkafka but ignored by its share consumer (its docs say so): refused too, so
#: that a setting never looks as if it did something.
SHARE_IGNORED: dict[str, str] = {
    "auto.commit.interval.ms": "nothing: Offtake acknowledges each record explicitly",
    "fetch.message.max.bytes": "nothing: the broker sizes share fetches (fetch.max.bytes applies)",
    "max.partition.fetch.bytes": "nothing: the broker sizes share fetches (fetch.max.bytes "
    "applies)",
    "max.in.flight.requests.per.connection": "nothing for the share consumer (for the producer of "
    "the sink, set it in spec.sink.kafka.config)",
}


def share_refused_reason(key: str) -> str | None:
    """Why a share consumer cannot take ``key``, with what the share group uses instead; None
    if it can."""
    if key in SHARE_REFUSED:
        return f"a share consumer refuses it (queue mode); instead: {SHARE_REFUSED[key]}"
    if key in SHARE_IGNORED:
        return f"a share consumer ignores it (queue mode); instead: {SHARE_IGNORED[key]}"
    return None


def share_refusal(where: str, props: Mapping[str, object]) -> tuple[str, str] | None:
    """The first property of ``props`` (set at ``where``, e.g. spec.kafka.config) that a share
    consumer cannot take, as (the field, the message) for a ConfigError; None if there is none.
    The loader asks it of spec.kafka.config, the worker of the Kafka Secret it merges too."""
    for key in props:
        reason = share_refused_reason(key)
        if reason is not None:
            return map_key(where, key), f"cannot be set with spec.source.groupType share: {reason}"
    return None


# --------------------------------------------------------------- secrets: never inline

_SECRET_SUFFIXES = ("password", "secret", "passphrase")
_SECRET_PROPERTIES = frozenset(
    {
        "sasl.jaas.config",
        "ssl.key.pem",
        "ssl_key.pem",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.assertion.private.key.pem",
    }
)


def is_secret_property(key: str) -> bool:
    """Whether a librdkafka property holds a secret (``sasl.password``, ``ssl.key.password``,
    ``sasl.oauthbearer.client.secret``, a private key, ...)."""
    low = key.lower()
    return low.endswith(_SECRET_SUFFIXES) or low in _SECRET_PROPERTIES


#: Spark properties that hold a secret: ``spark.hadoop.fs.s3a.secret.key``,
#: ``...access.key``, ``spark.ssl.keyPassword``, ``spark.authenticate.secret``, an Azure
#: account key or SAS token, a GCS service account's private key, an OAuth token.
SPARK_SECRET_MARKERS = (
    "password",
    "secret",
    "token",
    "access.key",
    "account.key",
    "private.key",
    ".sas.",
)


def is_secret_spark_property(key: str) -> bool:
    low = key.lower()
    return any(marker in low for marker in SPARK_SECRET_MARKERS)


# --------------------------------------------------------------- credentials in URLs

#: A URL with a credential inline: ``scheme://user:password@host`` (``jdbc:postgresql://`` too),
#: a ``password=``/``pwd=``/``token=`` parameter after ``?``, ``&`` or ``;`` (libpq, SQLAlchemy,
#: MySQL and SQL Server JDBC; Spark Connect's ``sc://host/;token=``), Oracle's
#: ``jdbc:oracle:thin:user/password@host``. The CRD's CEL rules use this very expression (RE2
#: and Python's re read it alike: no backslashes, no look-around).
URL_CREDENTIALS = (
    "(?i)(^[a-z][a-z0-9+.:-]*://[^/?#@]*:[^/?#@]*@"
    "|[?&;][ ]*(password|pwd|token)[ ]*="
    "|^jdbc:oracle:[a-z]+:[^@/]*/[^@]*@)"
)


def has_url_credentials(url: str) -> bool:
    """Whether ``url`` carries a password or token inline."""
    return re.search(URL_CREDENTIALS, url) is not None


def map_key(path: str, key: str) -> str:
    """A map entry's field path: ``spec.kafka.config["plugin.library.paths"]`` (the key
    quoted, since property names contain dots)."""
    return f"{path}[{json.dumps(key)}]"


# --------------------------------------------------------------- the operator's allowlist

#: What the operator's own clients (lag, rewind, redrive progress) take from a pipeline's
#: config and Secret: where the brokers are and how to authenticate, nothing else.
OPERATOR_PROPERTIES = frozenset(
    {
        "bootstrap.servers",
        "metadata.broker.list",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.pem",
        "ssl.certificate.pem",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "ssl.cipher.suites",
        "ssl.curves.list",
        "ssl.sigalgs.list",
        # OAUTHBEARER, client credentials against a token endpoint (secret from the Secret).
        "sasl.oauthbearer.config",
        "enable.sasl.oauthbearer.unsecure.jwt",
        "sasl.oauthbearer.method",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.extensions",
        "sasl.oauthbearer.token.endpoint.url",
        "https.ca.pem",
        "client.id",
        "client.dns.lookup",
        "client.rack",
        "broker.address.family",
        "socket.timeout.ms",
        "socket.connection.setup.timeout.ms",
        "socket.keepalive.enable",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "metadata.max.age.ms",
        "topic.metadata.refresh.interval.ms",
        "api.version.request",
        "broker.version.fallback",
        "receive.message.max.bytes",  # the operator sets its own cap (offtake_operator.lag)
        "fetch.max.bytes",  # likewise: librdkafka wants it <= receive.message.max.bytes - 512
        "logger",  # set by Offtake itself (refused from tenants above)
    }
)
#: ``ssl.ca.location`` reads a file of the operator's container; only librdkafka's ``probe``
#: (the system's CA bundle) is passed on.
_OPERATOR_VALUES = {"ssl.ca.location": ("probe",)}


def operator_client_properties(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` reduced to :data:`OPERATOR_PROPERTIES` (and ``ssl.ca.location=probe``)."""
    return {
        k: v
        for k, v in conf.items()
        if k in OPERATOR_PROPERTIES or str(v) in _OPERATOR_VALUES.get(k, ())
    }
