"""A real Apache Kafka broker (KRaft, single combined broker+controller node) on loopback
ports, in a throw-away folder: a plain ``java -cp libs/* kafka.Kafka server.properties`` of the
jars :func:`~offtake_testbed.kafka.install_kafka` resolved."""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

# Imported from where it is defined: confluent_kafka.admin re-exports it only implicitly,
# which mypy --strict rejects.
from confluent_kafka.admin._metadata import ClusterMetadata

from ..maven import find_java
from ..process import free_port, port_open, terminate
from .install import KAFKA_VERSION, KafkaTestbedError, install_kafka
from .jvm import (
    KafkaService,
    format_storage,
    launch_broker,
    log_tail,
    new_cluster_id,
    remove_stale_workdirs,
    write_server_config,
)

if TYPE_CHECKING:
    # Imported when a broker with TLS starts: a plain broker (and `install`) needs no
    # cryptography package and pays nothing for it.
    from .._pki import CertificateAuthority, KeyPair

__all__ = [
    "MTLS_LISTENER",
    "PROTOCOLS",
    "SCRAM_LISTENER",
    "SCRAM_TLS_LISTENER",
    "TLS_LISTENER",
    "KafkaBroker",
    "read_topic",
]

_log = logging.getLogger(__name__)

_WORKDIR_PREFIX = "offtake-kafka-"

_MetadataCheck = Callable[[ClusterMetadata], bool]

# The secured listeners' names (the PLAINTEXT and CONTROLLER listeners are always there).
SCRAM_LISTENER = "SCRAM"  # SASL_PLAINTEXT, mechanism SCRAM-SHA-512
TLS_LISTENER = "TLS"  # SSL, server certificate only
MTLS_LISTENER = "MTLS"  # SSL, and the client must present a certificate the CA signed
SCRAM_TLS_LISTENER = "SCRAM_TLS"  # SASL_SSL with SCRAM-SHA-512: Strimzi's usual scram listener
#: Each listener's security protocol.
PROTOCOLS = {
    "PLAINTEXT": "PLAINTEXT",
    "CONTROLLER": "PLAINTEXT",
    SCRAM_LISTENER: "SASL_PLAINTEXT",
    TLS_LISTENER: "SSL",
    MTLS_LISTENER: "SSL",
    SCRAM_TLS_LISTENER: "SASL_SSL",
}
# SCRAM users are written into the storage format command as name=...,password=...: keep them
# to characters that need no quoting there (and that no shell or log mangles).
_SCRAM_SAFE = re.compile(r"[A-Za-z0-9._-]+")


class KafkaBroker(KafkaService):
    """A single-node KRaft Kafka broker on 127.0.0.1, in a temporary folder.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        version: str = KAFKA_VERSION,
        heap: str = "768m",
        start_timeout: float = 120.0,  # generous: a loaded 2-core CI box can take 15 s+
        extra_config: Mapping[str, str] | None = None,
        scram_users: Mapping[str, str] | None = None,
        tls: bool = False,
        host: str = "127.0.0.1",
        features: Mapping[str, int] | None = None,
    ) -> None:
        """``scram_users`` (name -> password) adds a SASL_PLAINTEXT listener with those
        SCRAM-SHA-512 users; ``tls`` adds an SSL listener and one that requires a client
        certificate, both with certificates made for this start (see :attr:`ca_pem`).
        ``host``: the address clients are given (bootstrap and advertised listeners); another
        than loopback (the test bed node's bridge, offtake_testbed.node.GATEWAY_IP) makes the
        broker listen on every interface so that pods reach it. ``features``: feature levels
        set when the storage is formatted (``{"share.version": 0}``: no share groups)."""
        self.features = dict(features or {})
        self.host = host
        self.version = version
        self.heap = heap
        self.start_timeout = start_timeout
        self.extra_config = dict(extra_config or {})
        for name, password in (scram_users or {}).items():
            if not (_SCRAM_SAFE.fullmatch(name) and _SCRAM_SAFE.fullmatch(password)):
                raise KafkaTestbedError(
                    f"SCRAM user {name!r}: names and passwords may use only A-Z a-z 0-9 . _ -"
                )
        self.scram_users = dict(scram_users or {})
        self.tls = tls
        self._requested_port = port
        self._port: int | None = None
        self._controller_port: int | None = None
        self._secured_ports: dict[str, int] = {}
        self._ca: CertificateAuthority | None = None
        self._server_pair: KeyPair | None = None
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # -- public state -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT`` of the running broker (127.0.0.1 by default), for ``bootstrap.servers``."""
        return f"{self.host}:{self.port}"

    @property
    def port(self) -> int:
        if self._port is None or self._process is None:
            raise KafkaTestbedError("the Kafka broker is not running; call start() first")
        return self._port

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise KafkaTestbedError("the Kafka broker is not running; call start() first")
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The broker's log4j log (removed together with the temp folder on stop())."""
        return self.workdir / "server.log"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def listener_bootstrap(self, listener: str) -> str:
        """``127.0.0.1:PORT`` of a secured listener: SCRAM_LISTENER, TLS_LISTENER,
        MTLS_LISTENER, or SCRAM_TLS_LISTENER (with both ``scram_users`` and ``tls``)."""
        if self._process is None:
            raise KafkaTestbedError("the Kafka broker is not running; call start() first")
        if listener not in self._secured_ports:
            raise KafkaTestbedError(
                f"this broker has no {listener} listener (start it with scram_users= or tls=True)"
            )
        return f"127.0.0.1:{self._secured_ports[listener]}"

    @property
    def secured_listeners(self) -> dict[str, str]:
        """Each secured listener's name and ``127.0.0.1:PORT`` (none without ``scram_users``
        or ``tls``)."""
        return {name: f"127.0.0.1:{port}" for name, port in self._secured_ports.items()}

    @property
    def ca_pem(self) -> str:
        """The PEM certificate of the CA that signed the TLS listeners' certificate (and the
        client certificates of :meth:`client_certificate`): what a client trusts."""
        if self._ca is None:
            raise KafkaTestbedError("this broker has no TLS listeners (start it with tls=True)")
        return self._ca.cert_pem

    def client_certificate(self, common_name: str = "offtake-client") -> KeyPair:
        """A client certificate the MTLS listener accepts (principal ``User:CN=<name>``)."""
        if self._ca is None:
            raise KafkaTestbedError("this broker has no TLS listeners (start it with tls=True)")
        return self._ca.client(common_name)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> KafkaBroker:
        """Install if needed, format storage, launch the JVM and wait until it serves metadata."""
        if self._process is not None:
            raise KafkaTestbedError(f"the Kafka broker is already running on {self.bootstrap}")
        java = find_java(KafkaTestbedError)
        libs = install_kafka(self.version)
        remove_stale_workdirs(_WORKDIR_PREFIX)
        # The pid in the name lets a later start() tidy up after a process that was killed.
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))
        try:
            self._port = self._requested_port or free_port()
            self._controller_port = free_port(taken={self._port})
            self._prepare_secured_listeners()
            write_server_config(self.workdir, self._server_properties())
            self._format_storage(java, libs)
            self._launch(java, libs)
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Shut the broker down (SIGTERM, then SIGKILL after ``timeout``) and delete its folder."""
        atexit.unregister(self._kill_at_exit)
        self._admin = None
        if self._process is not None:
            terminate(self._process, timeout)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._port = self._controller_port = None
        self._secured_ports = {}
        self._ca = self._server_pair = None

    # -- topics -------------------------------------------------------------------------------

    def delete_topic(self, name: str, timeout: float = 30.0, missing_ok: bool = False) -> None:
        """Delete ``name`` and return once the broker's metadata no longer lists it."""
        futures = self.admin().delete_topics([name], operation_timeout=timeout)
        try:
            futures[name].result(timeout=timeout)
        except KafkaException as exc:
            if not (missing_ok and "UNKNOWN_TOPIC" in str(exc)):
                raise KafkaTestbedError(f"could not delete topic {name!r}: {exc}") from exc
        self._wait_for(lambda md: name not in md.topics, timeout, f"topic {name!r} to vanish")

    # -- internals ----------------------------------------------------------------------------

    def _prepare_secured_listeners(self) -> None:
        names = ([SCRAM_LISTENER] if self.scram_users else []) + (
            [TLS_LISTENER, MTLS_LISTENER] if self.tls else []
        )
        if self.scram_users and self.tls:
            names.append(SCRAM_TLS_LISTENER)
        taken = {p for p in (self._port, self._controller_port) if p is not None}
        for name in names:
            port = free_port(taken)
            taken.add(port)
            self._secured_ports[name] = port
        if self.tls:
            from .._pki import CertificateAuthority

            # New for every start: nothing is cached, and a CA never outlives its broker.
            self._ca = CertificateAuthority()
            self._server_pair = self._ca.server("offtake-testbed-kafka")

    def _server_properties(self) -> dict[str, str]:
        controller = f"127.0.0.1:{self._controller_port}"
        # The plain listener stays first and carries inter-broker traffic; the secured ones
        # are only for clients under test.
        served = {"PLAINTEXT": self._port, **self._secured_ports}
        advertised = ",".join(f"{name}://{self.host}:{port}" for name, port in served.items())
        bind = "127.0.0.1" if self.host == "127.0.0.1" else "0.0.0.0"
        listeners = ",".join(f"{name}://{bind}:{port}" for name, port in served.items())
        protocols = {name: PROTOCOLS[name] for name in [*served, "CONTROLLER"]}
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # A static voter set: formatting needs no --standalone and the quorum is instant.
            "controller.quorum.voters": f"1@{controller}",
            "listeners": f"{listeners},CONTROLLER://{controller}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # Internal topics default to replication factor 3, impossible on one node.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Share groups (queue mode) may set locks as short as a second, so that tests see
            # a lock expire without waiting the 15 s of the broker's default minimum.
            "group.share.min.record.lock.duration.ms": "1000",
            # Tests start many short-lived groups; make joining and timing out quick.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
            # Small files, and a cleaner that does not reserve 128 MiB of a modest heap.
            "log.segment.bytes": str(16 * 1024 * 1024),
            "log.retention.hours": "24",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        props.update(self._secured_properties())
        props.update(self.extra_config)
        return props

    def _secured_properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        for name in (SCRAM_LISTENER, SCRAM_TLS_LISTENER):
            if name not in self._secured_ports:
                continue
            scram = f"listener.name.{name.lower()}"
            props[f"{scram}.sasl.enabled.mechanisms"] = "SCRAM-SHA-512"
            # The broker side of SCRAM needs no credentials of its own: the users live in the
            # cluster metadata (written at format time, see _format_storage).
            props[f"{scram}.scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            )
        if self._ca is not None and self._server_pair is not None:
            for name in (TLS_LISTENER, MTLS_LISTENER, SCRAM_TLS_LISTENER):
                if name not in self._secured_ports:
                    continue
                prefix = f"listener.name.{name.lower()}"
                # PEM text in the properties themselves: Kafka reads a PEM keystore *file*
                # only with an encrypted key, and inline PEM needs no keytool or PKCS#12 step.
                props[f"{prefix}.ssl.keystore.type"] = "PEM"
                props[f"{prefix}.ssl.keystore.certificate.chain"] = self._server_pair.cert_pem
                props[f"{prefix}.ssl.keystore.key"] = self._server_pair.key_pem
            mtls = f"listener.name.{MTLS_LISTENER.lower()}"
            props[f"{mtls}.ssl.client.auth"] = "required"
            props[f"{mtls}.ssl.truststore.type"] = "PEM"
            props[f"{mtls}.ssl.truststore.certificates"] = self._ca.cert_pem
        return props

    def _format_storage(self, java: str, libs: Path) -> None:
        # SCRAM credentials as bootstrap metadata records: KRaft has them from the first
        # moment, with no kafka-configs call (and no wait for it) after the start.
        scram = [
            f"--add-scram=SCRAM-SHA-512=[name={name},password={password}]"
            for name, password in self.scram_users.items()
        ]
        features = [f"--feature={name}={level}" for name, level in self.features.items()]
        format_storage(
            java, libs, self.workdir, new_cluster_id(), "the KRaft storage", [*scram, *features]
        )

    def _launch(self, java: str, libs: Path) -> None:
        self._process = launch_broker(java, libs, self.workdir, self.heap, initial_heap="128m")
        atexit.register(self._kill_at_exit)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        # A plain TCP probe first: the AdminClient would log a connection error every 50 ms.
        while not all(port_open(p) for p in (self.port, *self._secured_ports.values())):
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._timeout_error()
            time.sleep(0.1)
        remaining = max(1.0, deadline - time.monotonic())
        try:
            self._wait_for(lambda md: 1 in md.brokers, remaining, "the broker to serve metadata")
        except KafkaTestbedError:
            raise self._timeout_error() from None
        self._wait_for_group_coordinator(deadline)

    def _wait_for_group_coordinator(self, deadline: float) -> None:
        """Wait until consumer groups work: the offsets topic is created on first use.

        Until it is loaded, group calls fail with NOT_COORDINATOR; tests and the demo that
        ask for committed offsets right after start would otherwise see that error.
        """
        conf = {"bootstrap.servers": self.bootstrap, "group.id": "offtake-testbed-warmup"}
        consumer = Consumer({**conf, "logger": _log})
        try:
            while True:
                self._check_alive()
                try:
                    consumer.committed([TopicPartition("__offtake_warmup", 0)], timeout=5.0)
                    return
                except KafkaException as exc:
                    if time.monotonic() > deadline:
                        raise KafkaTestbedError(
                            f"the broker on {self.bootstrap} never served consumer groups: {exc}"
                        ) from None
                    time.sleep(0.2)
        finally:
            consumer.close()

    def _wait_for(self, condition: _MetadataCheck, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last_error = ""
        while True:
            self._check_alive()
            try:
                if condition(self.admin().list_topics(timeout=2.0)):
                    return
            except KafkaException as exc:
                last_error = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise KafkaTestbedError(
                    f"timed out after {timeout:g}s waiting for {what}" + last_error
                )
            time.sleep(0.1)

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            raise KafkaTestbedError(f"the Kafka broker exited with code {code}:\n{self.log_tail()}")

    def _timeout_error(self) -> KafkaTestbedError:
        return KafkaTestbedError(
            f"Kafka broker did not answer metadata requests on {self.bootstrap} within "
            f"{self.start_timeout:g}s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the JVM's console output and of the broker log, for error reports."""
        return log_tail(self.workdir, lines, "the broker")

    def _kill_at_exit(self) -> None:
        # Last resort if the owner never called stop(): never leave a 768 MiB JVM behind.
        self.stop(timeout=5.0)


def read_topic(
    bootstrap: str, topic: str, timeout: float = 60.0, isolation: str = "read_committed"
) -> list[Message]:
    """Every record of ``topic`` up to its log end as of this call, in no consumer group.

    Plain assignment from the beginning: no group join to wait for, and nothing committed,
    so reading a topic never changes what a pipeline under test sees. ``isolation`` is the
    reader's isolation.level: read_committed (librdkafka's default) skips aborted transactions'
    records and waits at an open transaction until it ends (a killed transactional producer's
    is aborted by the broker after its transaction.timeout.ms). The end is the log's end as
    written (its high watermark), so a read right after ``commit_transaction`` waits for the
    commit's markers instead of stopping before them. Raises :class:`KafkaTestbedError`
    naming each partition's position and end if the end is not reached within ``timeout``.
    """
    consumer = _reader(bootstrap, isolation)
    try:
        parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = _log_ends(bootstrap, topic, parts)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        todo = {p for p, end in ends.items() if end > 0}
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                err = m.error()
                p = m.partition() or 0
                if err is None:
                    out.append(m)
                    if (m.offset() or 0) + 1 >= ends[p]:
                        todo.discard(p)
                elif err.code() == KafkaError._PARTITION_EOF:
                    # The end is the high watermark. A transactional log ends in a commit marker
                    # that no record's offset reaches, and read_committed stops early at an open
                    # transaction: only the position tells.
                    (pos,) = consumer.position([TopicPartition(topic, p)])
                    if pos.offset >= ends[p]:
                        todo.discard(p)
        if todo:
            where = consumer.position([TopicPartition(topic, p) for p in sorted(todo)])
            raise KafkaTestbedError(
                f"could not read {topic} to its end within {timeout:g}s ({isolation}): read "
                f"{len(out)} record(s); "
                + ", ".join(
                    f"partition {w.partition} at {w.offset} of {ends[w.partition]}" for w in where
                )
            )
    finally:
        consumer.close()
    return out


def _reader(bootstrap: str, isolation: str) -> Consumer:
    # In no consumer group's business: assigned by hand, nothing committed.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"offtake-testbed-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "logger": _log,
        }
    )


def _log_ends(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """Each partition's high watermark: the end of the log as written, markers included.

    Asked with read_uncommitted on purpose. A read_committed consumer's watermark query
    answers the last stable offset, which stays before a committed transaction until the
    broker has applied the commit marker, a moment after ``commit_transaction`` returned (on
    a loaded machine, long enough to see): taken as the end, it made a read right after a
    commit return no records at all (issue 41).
    """
    consumer = _reader(bootstrap, "read_uncommitted")
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
    finally:
        consumer.close()
