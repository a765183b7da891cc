"""One broker JVM: what :class:`~offtake_testbed.kafka.KafkaBroker` and each node of
:class:`~offtake_testbed.kafka_cluster.KafkaCluster` run, and the admin calls both make."""

from __future__ import annotations

import base64
import logging
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# Imported from where they are defined: confluent_kafka.admin re-exports them only implicitly,
# which mypy --strict rejects.
from confluent_kafka.admin._metadata import ClusterMetadata
from confluent_kafka.cimpl import NewTopic

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


def create_topic(
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


def remove_stale_workdirs(prefix: str) -> None:
    """Delete the folders ``<prefix><pid>-*`` whose process is gone (killed before its stop())."""
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _escape_property(value: str) -> str:
    """A value for a Java .properties line: backslashes and line breaks (PEM text) escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "")


def admin_client(bootstrap: str) -> AdminClient:
    # logger=: librdkafka's connection errors go to Python logging (captured by pytest), not stderr.
    return AdminClient({"bootstrap.servers": bootstrap}, logger=_log)


def topic_ready(metadata: ClusterMetadata, name: str, partitions: int) -> bool:
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) != partitions:
        return False
    return all(p.leader >= 0 for p in topic.partitions.values())
