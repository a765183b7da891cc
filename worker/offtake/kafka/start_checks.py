"""The worker's start-up checks against Kafka, before it joins its group (``offtake worker``).

Each says what is wrong in one log line naming the field to fix, and the CLI exits 3 on it:
the pod restarts with back-off instead of a worker that retries forever and looks alive.
"""

from __future__ import annotations

import logging
import threading

from offtake.config.spec import PipelineSpec
from offtake.kafka.config import consumer_config
from offtake.kafka.real import missing_topics, reach_brokers
from offtake.redact import redact


def reach_kafka(
    spec: PipelineSpec, instance_id: str | None, stopping: threading.Event, log: logging.Logger
) -> bool:
    """Wait up to spec.kafka.connectTimeoutSeconds for a broker; False (logged) if none answered.

    Without this bound a worker whose brokers are unreachable retries forever and looks alive;
    exiting lets the pod restart with back-off and shows the cause in one line. Readiness stays
    false meanwhile: the worker has no partitions yet. A broker that refuses the credentials or
    the TLS handshake ends the wait at once: waiting longer would only repeat the refusal.
    """

    servers, timeout = spec.kafka.bootstrap_servers, spec.kafka.connect_timeout_seconds
    log.info("connecting to Kafka at %s (for up to %.0f s)", redact(servers), timeout)
    failure = reach_brokers(consumer_config(spec, instance_id), timeout, stopping)
    if failure is None:
        return not stopping.is_set()
    if failure.kind == "authentication":
        # Only the fields are named, never a value: the error is librdkafka's, which carries
        # the mechanism and the broker, not the password.
        log.error(
            "Kafka at %s refused the worker's credentials: authentication failed (check "
            "sasl.username, sasl.password and sasl.mechanism from spec.kafka.secretRef and "
            "spec.kafka.config); %s; exit code 3",
            servers,
            failure.message,
        )
    elif failure.kind == "tls":
        log.error(
            "TLS with Kafka at %s failed (check ssl.ca.pem from spec.kafka.caSecretRef or "
            "spec.kafka.secretRef, and security.protocol); %s; exit code 3",
            servers,
            failure.message,
        )
    else:
        log.error(
            "no Kafka broker reachable at %s (spec.kafka.bootstrapServers) within %.0f s "
            "(spec.kafka.connectTimeoutSeconds); last error: %s; exit code 3",
            servers,
            timeout,
            failure.message,
        )
    return False


def retry_topics_exist(spec: PipelineSpec, instance_id: str | None, log: logging.Logger) -> bool:
    """errors.retryTopics: the topics must exist; the worker does not create them.

    Without them every retry send would fail (and stop the worker) and the subscription would
    silently miss them; saying so at start names the topics to create. Exit code 3, like an
    unreachable broker: the pod restarts with back-off and starts once they exist.
    """
    names = spec.errors.retry_topic_names(spec.source.topics)
    if not names:
        return True

    try:
        missing = missing_topics(
            consumer_config(spec, instance_id), names, spec.kafka.connect_timeout_seconds
        )
    except Exception as exc:  # the brokers answered a moment ago: say so and go on
        log.warning("could not check that the retry topics exist: %s", exc)
        return True
    if missing:
        log.error(
            "retry topic(s) %s of spec.errors.retryTopics do not exist (or are not visible to "
            "this principal): create them (the worker does not), with a retention well above "
            "their delay; exit code 3",
            ", ".join(missing),
        )
    return not missing
