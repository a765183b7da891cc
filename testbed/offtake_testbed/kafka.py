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
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# Imported from where they are defined: confluent_kafka.admin re-exports them only implicitly,
# which mypy --strict rejects.
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.cimpl import NewTopic

from ._cache import Progress, cache_dir, folder_size, megabytes

if TYPE_CHECKING:
    # Imported when a broker with TLS starts: a plain broker (and `install`) needs no
    # cryptography package and pays nothing for it.
    from ._pki import CertificateAuthority, KeyPair
from ._service import Service

__all__ = [
    "KAFKA_VERSION",
    "KafkaBroker",
    "KafkaTestbedError",
    "install_kafka",
    "main",
    "read_topic",
]

# 4.3.x is a patch-released line of Kafka 4 (KRaft only, log4j2, broker on Java 17).
KAFKA_VERSION = "4.3.1"

# Kafka's pom declares no logging backend (the binary distribution ships one in libs/); these
# are the same log4j2 jars, bound to the slf4j 1.7 API that kafka_2.13 depends on.
_LOG4J_VERSION = "2.24.3"
# Pinned because Maven 3.8's built-in default for this plugin is too old to be reliable.
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MARKER = ".offtake-installed"
_MVN_TIMEOUT_S = 900.0
# Maven 3.8 still emits colour resets in batch mode; they would garble our error messages.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_MAVEN_ADVICE = re.compile(
    r"^\[ERROR\]\s*$|re-run Maven|-e switch|-X switch|please read|\[Help 1\] http"
)

_log = logging.getLogger(__name__)

_WORKDIR_PREFIX = "offtake-kafka-"

_MetadataCheck = Callable[[ClusterMetadata], bool]

# The secured listeners' names (the PLAINTEXT and CONTROLLER listeners are always there).
SCRAM_LISTENER = "SCRAM"  # SASL_PLAINTEXT, mechanism SCRAM-SHA-512
TLS_LISTENER = "TLS"  # SSL, server certificate only
MTLS_LISTENER = "MTLS"  # SSL, and the client must present a certificate the CA signed
SCRAM_TLS_LISTENER = "SCRAM_TLS"  # SASL_SSL with SCRAM-SHA-512: Strimzi's usual scram listener
_PROTOCOLS = {
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


class KafkaTestbedError(RuntimeError):
    """Installing or running the test broker failed; the message says why and what to do."""


# --------------------------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------------------------


def install_kafka(version: str = KAFKA_VERSION, *, progress: IO[str] | None = None) -> Path:
    """Resolve Kafka ``version`` and its runtime jars into the cache; return the libs folder.

    Idempotent and cheap when already done: a marker file written after a complete download is
    all that is checked. Progress lines go to ``progress`` (e.g. ``sys.stderr``) if given.
    """
    say = Progress("kafka", progress)
    version_dir = cache_dir("kafka", version)
    libs = version_dir / "libs"
    if _is_installed(version_dir, libs):
        say.cached(f"Kafka {version} ({_jars_summary(libs)})", libs)
        return libs
    # A file lock, because parallel test processes may all try to install on a cold cache.
    with _locked(version_dir / ".install.lock"):
        if _is_installed(version_dir, libs):
            say.cached(f"Kafka {version} ({_jars_summary(libs)})", libs)
            return libs
        started = time.monotonic()
        _resolve_with_maven(version, version_dir, libs, say)
        say.say(
            f"Kafka {version}: {_jars_summary(libs)} in {libs}, "
            f"fetched in {time.monotonic() - started:.1f} s"
        )
    return libs


def _jars_summary(libs: Path) -> str:
    count, size = folder_size(libs)
    return f"{count} jars, {megabytes(size)}"


def _is_installed(version_dir: Path, libs: Path) -> bool:
    return (version_dir / _MARKER).is_file() and libs.is_dir()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _resolve_with_maven(version: str, version_dir: Path, libs: Path, say: Progress) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaTestbedError("mvn not found on PATH: Maven 3.6+ is needed to fetch Kafka jars")
    with tempfile.TemporaryDirectory(prefix="mvn-", dir=version_dir) as work:
        staging = Path(work) / "libs"
        (Path(work) / "pom.xml").write_text(_pom(version))
        _run_maven(mvn, Path(work), staging, version, say)
        if not (staging / f"kafka_2.13-{version}.jar").is_file():
            raise KafkaTestbedError(f"Maven finished but kafka_2.13-{version}.jar is missing")
        # Swap in the complete folder only now, so a crash never leaves a half-filled libs/.
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    (version_dir / _MARKER).write_text(f"kafka_2.13 {version}\n")


def _run_maven(mvn: str, work: Path, output: Path, version: str, say: Progress) -> None:
    command = [
        mvn,
        "-B",
        "-U",  # retry artifacts whose earlier failure (e.g. no network) Maven has cached
        "-Dstyle.color=never",
        # Keep Maven's local repository inside the Offtake cache, like every other download.
        f"-Dmaven.repo.local={cache_dir('maven', 'repository')}",
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output}",
    ]
    say.say(
        f"resolving org.apache.kafka:kafka_2.13:{version} and its runtime jars from Maven "
        "Central (a cold cache downloads about 60 MB, including Maven's own plugins)"
    )
    code, log = run_maven(command, work, say, _MVN_TIMEOUT_S)
    if code is None:
        raise KafkaTestbedError(
            f"Maven did not finish resolving Kafka {version} within {_MVN_TIMEOUT_S:.0f}s"
        )
    if code != 0:
        tail = _maven_errors(log)
        raise KafkaTestbedError(
            f"could not resolve org.apache.kafka:kafka_2.13:{version} from Maven Central:\n{tail}"
        )


def run_maven(
    command: list[str], work: Path, say: Progress, timeout: float
) -> tuple[int | None, str]:
    """Run Maven in ``work``, reporting its downloads as they go; (exit code, output), the
    exit code None when it ran past ``timeout`` seconds and was killed."""
    process = subprocess.Popen(
        command,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # A timer rather than a deadline check per line: a stalled download prints nothing.
    expired = threading.Event()

    def give_up() -> None:
        expired.set()
        process.kill()

    watchdog = threading.Timer(timeout, give_up)
    watchdog.start()
    counter = _DownloadCounter(say)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            counter.feed(line)
        code = process.wait()
    finally:
        watchdog.cancel()
    counter.report(final=True)
    return (None if expired.is_set() else code), "".join(lines)


class _DownloadCounter:
    """Counts Maven's "Downloaded from" lines; reports every few seconds while it downloads."""

    _EVERY_S = 5.0
    _DOWNLOADED = re.compile(r"Downloaded from \S+: \S+ \(([\d.]+) (B|kB|MB|GB)")
    _UNITS: ClassVar[dict[str, int]] = {"B": 1, "kB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000}

    def __init__(self, say: Progress) -> None:
        self.say = say
        self.files = 0
        self.bytes = 0.0
        self.started = time.monotonic()
        self.last_report = self.started

    def feed(self, line: str) -> None:
        found = self._DOWNLOADED.search(_ANSI_ESCAPE.sub("", line))
        if found is None:
            return
        self.files += 1
        self.bytes += float(found.group(1)) * self._UNITS[found.group(2)]
        if time.monotonic() - self.last_report >= self._EVERY_S:
            self.report(final=False)

    def report(self, *, final: bool) -> None:
        self.last_report = time.monotonic()
        if not self.files and final:
            self.say.say("Maven found every file in its local repository (cache), nothing fetched")
            return
        self.say.say(
            f"Maven {'downloaded' if final else 'has downloaded'} {self.files} files "
            f"({megabytes(int(self.bytes))}) in {self.last_report - self.started:.0f} s"
        )


def _maven_errors(output: str) -> str:
    """Maven's own error lines without colour codes and the generic "re-run with -X" advice."""
    lines = _ANSI_ESCAPE.sub("", output).splitlines()
    errors = [
        line for line in lines if line.startswith("[ERROR]") and not _MAVEN_ADVICE.search(line)
    ]
    return "\n".join(errors).strip() or _tail_text("\n".join(lines), 40)


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-core", _LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", _LOG4J_VERSION),
    ]
    xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.offtake.testbed</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{xml}
  </dependencies>
</project>
"""


# --------------------------------------------------------------------------------------------
# The broker
# --------------------------------------------------------------------------------------------

_LOG4J2_PROPERTIES = """\
status = warn
# The JVM's own shutdown hook is enough; log4j's hook only races it and warns.
shutdownHook = disable
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
# Per-request and state-change chatter would drown the lines that explain a failure.
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class KafkaBroker(Service):
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
        self._admin: AdminClient | None = None

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
        java = _find_java()
        libs = install_kafka(self.version)
        _remove_stale_workdirs()
        # The pid in the name lets a later start() tidy up after a process that was killed.
        self._workdir = Path(tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-"))
        try:
            self._port = self._requested_port or _free_port()
            self._controller_port = _free_port(exclude=self._port)
            self._prepare_secured_listeners()
            _write_server_config(self.workdir, self._server_properties())
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
            _terminate(self._process, timeout)
            self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._port = self._controller_port = None
        self._secured_ports = {}
        self._ca = self._server_pair = None

    # -- topics -------------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        """A shared AdminClient for this broker (librdkafka logs go to Python logging)."""
        if self._admin is None:
            self._admin = _admin_client(self.bootstrap)
        return self._admin

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create ``name`` and return once every partition has a leader."""
        _create_topic(self.admin(), name, partitions, 1, config, timeout)
        self._wait_for(
            lambda md: _topic_ready(md, name, partitions),
            timeout,
            f"topic {name!r} to get leaders for {partitions} partitions",
        )

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
        taken = {self._port, self._controller_port}
        for name in names:
            port = _free_port()
            while port in taken:
                port = _free_port()
            taken.add(port)
            self._secured_ports[name] = port
        if self.tls:
            from ._pki import CertificateAuthority

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
        protocols = {name: _PROTOCOLS[name] for name in [*served, "CONTROLLER"]}
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
        _format_storage(
            java, libs, self.workdir, new_cluster_id(), "the KRaft storage", [*scram, *features]
        )

    def _launch(self, java: str, libs: Path) -> None:
        self._process = _launch_broker(java, libs, self.workdir, self.heap, initial_heap="128m")
        atexit.register(self._kill_at_exit)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        # A plain TCP probe first: the AdminClient would log a connection error every 50 ms.
        while not all(_port_open(p) for p in (self.port, *self._secured_ports.values())):
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
        return _log_tail(self.workdir, lines, "the broker")

    def _kill_at_exit(self) -> None:
        # Last resort if the owner never called stop(): never leave a 768 MiB JVM behind.
        self.stop(timeout=5.0)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def read_topic(
    bootstrap: str, topic: str, timeout: float = 60.0, isolation: str = "read_committed"
) -> list[Message]:
    """Every record of ``topic`` up to its log end as of this call, in no consumer group.

    Plain assignment from the beginning: no group join to wait for, and nothing committed,
    so reading a topic never changes what a pipeline under test sees. ``isolation`` is the
    reader's isolation.level: read_committed (librdkafka's default) skips aborted transactions'
    records and waits at an open transaction until it ends (a killed transactional producer's
    is aborted by the broker after its transaction.timeout.ms).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"offtake-testbed-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "logger": _log,
        }
    )
    try:
        parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in parts
        }
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
    finally:
        consumer.close()
    if todo:
        raise KafkaTestbedError(f"could not read {topic} to its end (partitions {sorted(todo)})")
    return out


# --------------------------------------------------------------------------------------------
# One broker JVM: what KafkaBroker and each node of kafka_cluster.KafkaCluster run
# --------------------------------------------------------------------------------------------


def new_cluster_id() -> str:
    """A random KRaft cluster id (a UUID in URL-safe base64, like ``kafka-storage random-uuid``)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _write_server_config(workdir: Path, properties: Mapping[str, str]) -> None:
    """``server.properties`` and the log4j2 configuration in the broker's folder."""
    lines = [f"{key}={_escape_property(value)}" for key, value in properties.items()]
    (workdir / "server.properties").write_text("\n".join(lines) + "\n")
    (workdir / "log4j2.properties").write_text(_LOG4J2_PROPERTIES)


def _jvm_command(
    java: str, libs: Path, workdir: Path, main_class: str, memory: list[str]
) -> list[str]:
    return [
        java,
        *memory,
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={workdir}",
        "-cp",
        f"{libs}/*",  # expanded by the JVM itself, not by a shell
        main_class,
    ]


def _format_storage(
    java: str, libs: Path, workdir: Path, cluster_id: str, what: str, extra: list[str]
) -> None:
    """Format the KRaft storage of the broker in ``workdir`` (``what`` names it in errors)."""
    # A one-second tool: skip the optimising compiler and G1 setup (~30% faster).
    memory = ["-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    command = [
        *_jvm_command(java, libs, workdir, "kafka.tools.StorageTool", memory),
        "format",
        # One argument with "=": a random id may start with "-", and as a separate argument
        # it would be taken for an option (about one start in 64 failed that way).
        f"--cluster-id={cluster_id}",
        f"--config={workdir / 'server.properties'}",
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise KafkaTestbedError(
            f"formatting {what} failed (exit {done.returncode}):\n"
            + _tail_text(done.stdout + done.stderr, 30)
        )


def _launch_broker(
    java: str, libs: Path, workdir: Path, heap: str, *, initial_heap: str
) -> subprocess.Popen[bytes]:
    """Start the broker of ``workdir``; its console output is appended to ``stdout.log``."""
    memory = [f"-Xmx{heap}", f"-Xms{initial_heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]
    command = [
        *_jvm_command(java, libs, workdir, "kafka.Kafka", memory),
        str(workdir / "server.properties"),
    ]
    with (workdir / "stdout.log").open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Own session: a terminal Ctrl-C reaches Python, which then stops it in order.
            start_new_session=True,
            preexec_fn=_die_with_parent_fn(),
        )


def _log_tail(workdir: Path, lines: int, who: str) -> str:
    """The last lines of a broker's console output and log, for error reports."""
    parts = []
    for name in ("stdout.log", "server.log"):
        path = workdir / name
        text = path.read_text(errors="replace").strip() if path.is_file() else ""
        if text:
            parts.append(f"--- {who}: {name} (last {lines} lines) ---\n{_tail_text(text, lines)}")
    return "\n".join(parts) or f"({who} wrote no output)"


def _create_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    replication: int,
    config: Mapping[str, str] | None,
    timeout: float,
) -> None:
    """Ask the brokers to create ``name``; the caller waits for what "ready" means to it."""
    topic = NewTopic(
        name, num_partitions=partitions, replication_factor=replication, config=dict(config or {})
    )
    futures = admin.create_topics([topic], operation_timeout=timeout)
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        raise KafkaTestbedError(f"could not create topic {name!r}: {exc}") from exc


def _remove_stale_workdirs() -> None:
    for path in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_WORKDIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaTestbedError("java not found on PATH (Kafka 4 needs Java 17+; or set JAVA_HOME)")
    return java


def _free_port(exclude: int | None = None) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port != exclude:
            return port


def _escape_property(value: str) -> str:
    """A value for a Java .properties line: backslashes and line breaks (PEM text) escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "")


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _admin_client(bootstrap: str) -> AdminClient:
    # logger=: librdkafka's connection errors go to Python logging (captured by pytest), not stderr.
    return AdminClient({"bootstrap.servers": bootstrap}, logger=_log)


def _topic_ready(metadata: ClusterMetadata, name: str, partitions: int) -> bool:
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _log.warning("Kafka broker ignored SIGTERM for %.0fs; killing it", timeout)
        process.kill()
        process.wait()


def _die_with_parent_fn() -> Callable[[], None] | None:
    """On Linux, make the JVM get SIGTERM if the Python process dies without cleaning up.

    Only when started from the main thread: the kernel ties this to the creating *thread*, so a
    broker started from a worker thread would otherwise die when that thread ends.
    """
    if (
        not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    import ctypes

    # Resolved here, in the parent: between fork and exec the child must not import or dlopen
    # (librdkafka's threads may hold those locks at fork time); it only makes this one call.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def set_parent_death_signal() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return set_parent_death_signal


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m offtake_testbed.kafka",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Shared by both commands, so the option may follow the command name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kafka-version", default=KAFKA_VERSION, help="%(default)s by default")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", parents=[common], help="fetch the jars, print their folder")
    run = commands.add_parser("run", parents=[common], help="run a broker until Ctrl-C")
    run.add_argument("--port", type=int, default=None, help="client port (default: a free one)")
    run.add_argument(
        "--scram-user",
        action="append",
        default=[],
        metavar="NAME:PASSWORD",
        help="add a SCRAM-SHA-512 user and a SASL_PLAINTEXT listener (repeatable)",
    )
    run.add_argument(
        "--tls",
        action="store_true",
        help="add TLS listeners (and SASL_SSL with --scram-user); prints the CA file",
    )
    return parser.parse_args(argv)


def _scram_users(specs: list[str]) -> dict[str, str]:
    users = {}
    for spec in specs:
        name, sep, password = spec.partition(":")
        if not (sep and name and password):
            raise KafkaTestbedError(f"--scram-user {spec!r}: expected NAME:PASSWORD")
        users[name] = password
    return users


def _run_foreground(broker: KafkaBroker) -> int:
    # SIGTERM (e.g. from a supervisor) should stop the broker as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    began = time.monotonic()
    with broker:
        print(f"Kafka {broker.version} ready in {time.monotonic() - began:.1f}s", flush=True)
        print(f"bootstrap: {broker.bootstrap}", flush=True)
        print(f"log: {broker.log_path}", flush=True)
        for name, port in broker._secured_ports.items():
            print(f"{name} ({_PROTOCOLS[name]}): 127.0.0.1:{port}", flush=True)
        if broker.tls:
            ca = broker.workdir / "ca.crt"
            ca.write_text(broker.ca_pem)
            print(f"CA certificate (ssl.ca.location): {ca}", flush=True)
        try:
            while broker.is_running():
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("stopping", flush=True)
            return 0
        print(f"the broker exited unexpectedly:\n{broker.log_tail()}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "install":
            print(install_kafka(args.kafka_version, progress=sys.stderr))
            return 0
        broker = KafkaBroker(
            args.port,
            version=args.kafka_version,
            scram_users=_scram_users(args.scram_user),
            tls=args.tls,
        )
        return _run_foreground(broker)
    except KafkaTestbedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
