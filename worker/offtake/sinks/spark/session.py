"""The worker's one long-lived SparkSession.

Starting a JVM costs seconds, so a worker starts one session and keeps it for every batch
(never one per batch). ``submit.mode`` picks where the work runs:

- ``local``: an in-process driver (``submit.master``, default ``local[*]``);
- ``connect``: a Spark Connect client for ``submit.connectUrl`` (no JVM in the worker);
- ``kubernetes``: a Spark Connect client of the pipeline's own server, which the operator has
  the Kubeflow Spark operator run (a SparkConnect, see kubernetes.py); its URL comes from
  ``$OFFTAKE_SPARK_CONNECT_URL`` (set by the operator) or the pipeline's name and namespace.

Connectors come from Maven coordinates (``spark.jars.packages``), resolved by Ivy from Maven
Central only (``ivysettings.xml``) into a cache outside the repository. The formats imply their
own packages (delta, the PostgreSQL JDBC driver) unless the spec pins a version of the same
artifact.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from offtake import environment
from offtake.config.secret_env import SPARK_CONNECT_TOKEN_ENV, read_secret_env
from offtake.config.spec import SparkSinkSpec
from offtake.errors import OfftakeError
from offtake.redact import redact
from offtake.sinks.spark.cache import ivy_dir, ivy_settings
from offtake.sinks.spark.class_archive import java_options

log = logging.getLogger(__name__)

# mode kubernetes: where the operator's SparkConnect serves (see kubernetes.py, which imports
# this module, so the two names live here).
CONNECT_URL_ENV = environment.SPARK_CONNECT_URL_ENV
#: The pipeline's Connect token, through secretKeyRef: in mode kubernetes from the operator's
#: generated Secret (sent as ``authorization: Bearer <token>``), in mode connect from
#: ``submit.tokenSecretRef`` (sent as Spark's ``;token=``). One variable, one name.
CONNECT_TOKEN_ENV = SPARK_CONNECT_TOKEN_ENV
CONNECT_PORT = 15002


def spark_connect_name(pipeline: str) -> str:
    return f"{pipeline}-spark"


#: The key of the token in the pipeline's token Secret.
TOKEN_KEY = "token"


def token_secret_name(pipeline: str) -> str:
    """The Secret (made and owned by the operator) with the pipeline's Connect token."""
    return f"{spark_connect_name(pipeline)}-token"


def token_refused(cfg: SessionConfig, pipeline: str) -> str:
    """What a Spark Connect server's UNAUTHENTICATED means for ``cfg``: which setting holds
    the token it refused, or that none was sent."""
    server = f"the Spark Connect server at {redact(cfg.connect_url or '')}"
    status = "(gRPC status UNAUTHENTICATED)"
    if cfg.token_env is not None:
        return f"sink.spark.submit.tokenSecretRef: {server} refused the token {status}"
    if cfg.mode == "kubernetes":
        secret = f"key {TOKEN_KEY!r} of the Secret {token_secret_name(pipeline)!r}"
        if environment.value(CONNECT_TOKEN_ENV):
            return (
                f"${CONNECT_TOKEN_ENV}: {server} refused the token ({secret}, which the "
                f"operator makes for the pipeline's server) {status}"
            )
        return f"${CONNECT_TOKEN_ENV}: not set ({secret}), and {server} requires it {status}"
    return f"sink.spark.submit.tokenSecretRef: not set, and {server} requires a token {status}"


def kubernetes_connect_url(pipeline: str, namespace: str) -> str:
    """The Service the spark-operator makes for the SparkConnect (``<name>-server``)."""
    return f"sc://{spark_connect_name(pipeline)}-server.{namespace}.svc:{CONNECT_PORT}"


# Delta releases are built for one Spark minor version each (the delta-spark_2.13 artifact).
DELTA_FOR_SPARK = {"4.0": "4.0.1", "4.1": "4.3.1", "4.2": "4.4.0"}
DELTA_DEFAULT = "4.4.0"
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.7"
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
_COORDINATE = re.compile(r"^[\w.\-]+:[\w.\-]+:[\w.\-+]+$")


class SparkSessionError(OfftakeError):
    """The session could not be configured or started; the message names the field."""


@dataclass(frozen=True)
class SessionConfig:
    """Everything needed to start (or reach) the session, derived from the sink spec."""

    mode: str
    master: str
    connect_url: str | None
    app_name: str
    packages: tuple[str, ...] = ()
    conf: dict[str, str] = field(default_factory=dict)
    #: The environment variable holding the server's token (submit.tokenSecretRef): added to
    #: the URL only where the channel is built, so no log line or error carries it.
    token_env: str | None = None

    @property
    def remote(self) -> bool:
        return self.mode in ("connect", "kubernetes")


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def default_packages(spec: SparkSinkSpec, version: str | None = None) -> list[str]:
    """Packages a format needs, unless the spec already names the same group:artifact."""
    wanted: list[str] = []
    if spec.format == "delta":
        minor = ".".join((version or spark_version()).split(".")[:2])
        wanted.append(f"io.delta:delta-spark_2.13:{DELTA_FOR_SPARK.get(minor, DELTA_DEFAULT)}")
    if (
        spec.format == "jdbc"
        and spec.jdbc is not None
        and spec.jdbc.url.startswith("jdbc:postgresql:")
    ):
        wanted.append(POSTGRES_JDBC)
    pinned = {_artifact(p) for p in spec.packages}
    return [p for p in wanted if _artifact(p) not in pinned]


def _artifact(coordinate: str) -> str:
    return ":".join(coordinate.split(":")[:2])


def session_config(
    spec: SparkSinkSpec, pipeline: str = "offtake", namespace: str = "default"
) -> SessionConfig:
    """Validate the submit fields and derive the session's settings."""
    for i, p in enumerate(spec.packages):
        if not _COORDINATE.match(p):
            raise SparkSessionError(
                f"sink.spark.packages[{i}]: {p!r} is not a Maven coordinate group:artifact:version"
            )
    submit = spec.submit
    if submit.mode == "connect" and not submit.connect_url:
        raise SparkSessionError("sink.spark.submit.connectUrl: required when mode is connect")
    if submit.connect_url is not None and not submit.connect_url.startswith("sc://"):
        raise SparkSessionError(
            f"sink.spark.submit.connectUrl: {redact(submit.connect_url)!r} must start with sc://"
        )
    url = submit.connect_url
    if submit.mode == "kubernetes":
        url = environment.value(CONNECT_URL_ENV) or kubernetes_connect_url(pipeline, namespace)
        if not url.startswith("sc://"):
            raise SparkSessionError(f"${CONNECT_URL_ENV}: {redact(url)!r} must start with sc://")
    packages = (*spec.packages, *default_packages(spec))
    conf = base_conf()
    if spec.format == "delta":
        conf.update(DELTA_CONF)
    if submit.mode == "local":
        # The class-data archive, if `offtake spark-archive` made one (class_archive.py).
        # Default options, not extra ones: spark.driver.extraJavaOptions stays the user's.
        archive = java_options()
        if archive is not None:
            conf["spark.driver.defaultJavaOptions"] = archive
    conf.update(submit.conf)
    return SessionConfig(
        mode=submit.mode,
        master=submit.master,
        connect_url=url,
        app_name=f"offtake-{pipeline}",
        packages=tuple(dict.fromkeys(packages)),
        conf=conf,
        token_env=SPARK_CONNECT_TOKEN_ENV if submit.token_secret_ref is not None else None,
    )


def with_token(url: str, token_env: str | None) -> str:
    """``url`` with ``;token=`` from ``token_env`` (Spark Connect's URL parameter)."""
    if token_env is None:
        return url
    token = read_secret_env(token_env, "sink.spark.submit.tokenSecretRef")
    return f"{url.rstrip('/')}/;token={token}" if "/;" not in url else f"{url};token={token}"


def base_conf() -> dict[str, str]:
    """The Spark conf of every session, before the format's and the spec's."""
    return {
        "spark.ui.enabled": "false",
        # Batches are small relative to a cluster; the default 200 shuffle partitions would
        # mostly schedule empty tasks.
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.session.timeZone": "UTC",
        # Parquet timestamps as the standard INT64 microseconds marked UTC rather than Spark's
        # default INT96 (deprecated in Parquet, no time zone): pandas, pyarrow, DuckDB and
        # Polars then read the `timestamp` column as a UTC timestamp, as documented.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.jars.ivy": str(ivy_dir()),
        # Maven Central only: Spark's default resolvers fall back to repos.spark-packages.org,
        # which many machines cannot reach (issue 41).
        "spark.jars.ivySettings": str(ivy_settings()),
    }


def create_session(cfg: SessionConfig) -> Any:
    """Start the session (or connect to the server). Blocks for seconds: call off the loop."""
    from pyspark.sql import SparkSession

    if cfg.remote:
        return _connect_session(cfg)
    builder = SparkSession.builder.master(cfg.master).appName(cfg.app_name)
    if cfg.packages:
        builder = builder.config("spark.jars.packages", ",".join(cfg.packages))
    for key, value in cfg.conf.items():
        builder = builder.config(key, value)
    log.info("starting Spark (%s) with packages %s", cfg.master, ",".join(cfg.packages) or "none")
    return builder.getOrCreate()


def _connect_session(cfg: SessionConfig) -> Any:
    """A Spark Connect session whose channel and client retry every few seconds at most."""
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert cfg.connect_url is not None
    # redact: a connectUrl may carry ``;token=`` (the server's credential).
    log.info("connecting to Spark Connect at %s", redact(cfg.connect_url))
    # What SparkSession.builder.remote() sets and this builder does not: without it
    # pyspark.sql.functions (F.lit, F.col, used by the writers and users' transforms) take the
    # classic path and fail with an empty AssertionError (no SparkContext in this process).
    environment.enable_spark_connect_mode()
    if cfg.token_env is not None:
        # mode connect, a server of the user's own: Spark's ;token=, so pyspark insists on TLS
        # to any host but localhost (the token crosses the user's network).
        channel = DefaultChannelBuilder(
            with_token(cfg.connect_url, cfg.token_env), channelOptions=CONNECT_CHANNEL_OPTIONS
        )
    elif token := environment.value(CONNECT_TOKEN_ENV):
        # mode kubernetes: the operator's own server, plaintext inside the namespace behind its
        # NetworkPolicy (see _bearer_channel_builder).
        channel = _bearer_channel_builder(cfg.connect_url, token)
    else:
        channel = DefaultChannelBuilder(cfg.connect_url, channelOptions=CONNECT_CHANNEL_OPTIONS)
    builder = ConnectSession.builder.channelBuilder(channel)
    # A Connect client passes runtime SQL conf only; static conf belongs to the server.
    for key, value in cfg.conf.items():
        if key.startswith("spark.sql.") and key not in DELTA_CONF:
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    _short_connect_backoff(session)
    return session


def _bearer_channel_builder(url: str, token: str) -> Any:
    """A channel builder that sends the token as Spark Connect's server checks it
    (``authorization: Bearer``). Not pyspark's ``;token=`` (or SPARK_CONNECT_AUTHENTICATE_TOKEN):
    with a token it insists on TLS to any host but ``localhost``, and the server of
    ``submit.mode: kubernetes`` speaks plaintext gRPC inside the namespace (its NetworkPolicy
    admits only the pipeline's workers). ``use_ssl=true`` in the URL still gets TLS."""
    import grpc
    from pyspark.sql.connect.client import DefaultChannelBuilder

    class BearerChannelBuilder(DefaultChannelBuilder):
        def metadata(self) -> list[tuple[str, str]]:
            return [*super().metadata(), ("authorization", f"Bearer {token}")]

        def toChannel(self) -> grpc.Channel:
            if self.use_ssl:  # the token goes in metadata() either way
                return self._secure_channel(self.endpoint, grpc.ssl_channel_credentials())
            return self._insecure_channel(self.endpoint)

    return BearerChannelBuilder(url, channelOptions=CONNECT_CHANNEL_OPTIONS)


# The Connect client's own retries of an unreachable server back off up to 60 s by default
# (15 tries, x4 each): a server back after 10 s was reached only ~70 s after it died. The sink
# waits out outages itself (sink.py), so the client gives up sooner and tries every few seconds.
CONNECT_MAX_BACKOFF_MS = 5000
# gRPC's own reconnect backoff (initial 1 s, x1.6 per failed connect, up to 120 s): after a
# minute of a dead server the channel waited ~45 s more before it tried the restarted one,
# failing every call at once meanwhile ("failed to connect to all addresses"). Measured: a
# server SIGKILLed for 60 s was reached 46.8 s after it listened again; with these, within
# one backoff of a few seconds (docs/reliability.md, scenario 3).
CONNECT_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", CONNECT_MAX_BACKOFF_MS),
]


def _short_connect_backoff(session: Any) -> None:
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session.client.set_retry_policies([DefaultPolicy(max_backoff=CONNECT_MAX_BACKOFF_MS)])


def is_remote(session: Any) -> bool:
    """True for a Spark Connect session (no JVM to reach through py4j)."""
    return ".connect." in type(session).__module__
