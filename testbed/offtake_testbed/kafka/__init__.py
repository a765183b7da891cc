"""A real Apache Kafka broker (KRaft, single combined broker+controller node) for tests and demos.

The broker is assembled from Maven Central jars only: Maven resolves ``kafka_2.13`` and its
runtime dependencies into ``cache_dir("kafka", <version>, "libs")`` once, and every broker after
that is a plain ``java -cp libs/* kafka.Kafka server.properties`` with its own throw-away data
folder on loopback ports.

    python -m offtake_testbed.kafka install        # resolve the jars, print the folder
    python -m offtake_testbed.kafka run --port N   # foreground broker until Ctrl-C
    python -m offtake_testbed.kafka run --scram-user alice:alice-pw --tls   # secured too

On request (``scram_users=``, ``tls=True``) a broker also listens with authentication and
encryption, beside its plain listener: SASL_PLAINTEXT with SCRAM-SHA-512 users, SSL with
certificates the test bed makes for each start, SSL that requires a client certificate, and
(with both) SASL_SSL with SCRAM-SHA-512.

The modules: :mod:`.install` (the jars), :mod:`.jvm` (one broker JVM, shared with
:mod:`offtake_testbed.kafka_cluster`), :mod:`.broker` (the service), :mod:`.cli`.
"""

from .broker import (
    MTLS_LISTENER,
    SCRAM_LISTENER,
    SCRAM_TLS_LISTENER,
    TLS_LISTENER,
    KafkaBroker,
    read_topic,
)
from .install import KAFKA_VERSION, KafkaTestbedError, install_kafka

__all__ = [
    "KAFKA_VERSION",
    "MTLS_LISTENER",
    "SCRAM_LISTENER",
    "SCRAM_TLS_LISTENER",
    "TLS_LISTENER",
    "KafkaBroker",
    "KafkaTestbedError",
    "install_kafka",
    "read_topic",
]
