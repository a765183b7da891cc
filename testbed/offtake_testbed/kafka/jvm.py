"""One broker JVM: what :class:`~offtake_testbed.kafka.KafkaBroker` and each node of
:class:`~offtake_testbed.kafka_cluster.KafkaCluster` run, and the admin calls both make."""

from __future__ import annotations

import base64
import logging
import shutil
import subprocess
import tempfile
import time
import uuid
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# Imported from where it is defined: confluent_kafka.admin re-exports it only implicitly,
# which mypy --strict rejects.
from confluent_kafka.cimpl import NewTopic

from .._service import Service
from ..process import die_with_parent, pid_alive, tail
from .install import KafkaTestbedError

_log = logging.getLogger(__name__)

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


def new_cluster_id() -> str:
    """A random KRaft cluster id (a UUID in URL-safe base64, like ``kafka-storage random-uuid``)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def write_server_config(workdir: Path, properties: Mapping[str, str]) -> None:
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


def format_storage(
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
            + tail(done.stdout + done.stderr, 30)
        )


def launch_broker(
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
            preexec_fn=die_with_parent(),
        )


def log_tail(workdir: Path, lines: int, who: str) -> str:
    """The last lines of a broker's console output and log, for error reports."""
    parts = []
    for name in ("stdout.log", "server.log"):
        path = workdir / name
        text = path.read_text(errors="replace").strip() if path.is_file() else ""
        if text:
            parts.append(f"--- {who}: {name} (last {lines} lines) ---\n{tail(text, lines)}")
    return "\n".join(parts) or f"({who} wrote no output)"


def remove_stale_workdirs(prefix: str) -> None:
    """Delete the folders ``<prefix><pid>-*`` whose process is gone (killed before its stop())."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _escape_property(value: str) -> str:
    """A value for a Java .properties line: backslashes and line breaks (PEM text) escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "")


class KafkaService(Service):
    """What the single broker and the cluster share: one AdminClient, and topics with a
    replica on every broker (``replication_factor``), ready once all of them are in sync."""

    replication_factor = 1
    _admin: AdminClient | None = None

    @property
    @abstractmethod
    def bootstrap(self) -> str: ...

    def admin(self) -> AdminClient:
        """A shared AdminClient (librdkafka's logs go to Python logging)."""
        if self._admin is None:
            self._admin = admin_client(self.bootstrap)
        return self._admin

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Create ``name``; return once every partition has a leader and all its replicas
        in sync."""
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=self.replication_factor,
            config=dict(config or {}),
        )
        futures = self.admin().create_topics([topic], operation_timeout=timeout)
        try:
            futures[name].result(timeout=timeout)
        except KafkaException as exc:
            raise KafkaTestbedError(f"could not create topic {name!r}: {exc}") from exc
        self.wait_fully_replicated(name, timeout, partitions=partitions)

    def wait_fully_replicated(
        self, topic: str, timeout: float = 120.0, *, partitions: int | None = None
    ) -> None:
        """Wait until every partition of ``topic`` (``partitions`` of them, when given) has a
        leader and all its replicas in sync."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            self._check_alive()
            try:
                md = self.admin().list_topics(topic, timeout=10)
                found = md.topics.get(topic)
                parts = {} if found is None or found.error is not None else found.partitions
                want = len(parts) if partitions is None else partitions
                if (
                    parts
                    and len(parts) == want
                    and all(
                        p.leader >= 0 and len(p.isrs) == self.replication_factor
                        for p in parts.values()
                    )
                ):
                    return
                last = f" (in sync: { {n: sorted(p.isrs) for n, p in sorted(parts.items())} })"
            except KafkaException as exc:
                last = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise KafkaTestbedError(f"{topic} not fully in sync within {timeout:g}s{last}")
            time.sleep(0.2)

    def _check_alive(self) -> None:
        """Raise KafkaTestbedError if the service's own process died (the cluster's nodes may
        be down on purpose)."""


def admin_client(bootstrap: str) -> AdminClient:
    # logger=: librdkafka's connection errors go to Python logging (captured by pytest), not stderr.
    return AdminClient({"bootstrap.servers": bootstrap}, logger=_log)
