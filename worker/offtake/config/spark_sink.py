"""The Spark sink's section of a manifest (``spec.sink.spark``) into a :class:`SparkSinkSpec`.

Part of the loader (offtake.config.loader), in a module of its own for its size: every
problem raises :class:`ConfigError` naming the field's path.
"""

from __future__ import annotations

import re
from typing import cast

from offtake.config._fields import ConfigError, Fields
from offtake.config.client_properties import is_secret_spark_property, map_key
from offtake.config.refs import no_url_credentials, secret_key_ref, secret_ref
from offtake.config.spark_conf import check_submit_conf
from offtake.config.spec import (
    IcebergSpec,
    JdbcSpec,
    SparkBatchSpec,
    SparkExecutorsSpec,
    SparkFormat,
    SparkMode,
    SparkServerSpec,
    SparkSinkSpec,
    SparkSubmitSpec,
)


def spark_sink(f: Fields) -> SparkSinkSpec:
    """spec.sink.spark, every field checked (the loader's sink section calls it)."""
    fmt = f.choice("format")
    path = f.opt_str("path")
    jdbc = _jdbc(f)
    iceberg = _iceberg(f)
    if fmt == "iceberg" and iceberg is None:
        raise ConfigError(f.at("iceberg"), "is required when format is iceberg")
    if fmt != "iceberg" and iceberg is not None:
        raise ConfigError(f.at("iceberg"), "is only used when format is iceberg")
    if fmt == "iceberg" and "partitionBy" in f.raw:
        raise ConfigError(
            f.at("partitionBy"), "is not used with format iceberg (partition the table itself)"
        )
    if fmt == "jdbc" and jdbc is None:
        raise ConfigError(f.at("jdbc"), "is required when format is jdbc")
    if fmt != "jdbc" and path is None:
        raise ConfigError(f.at("path"), f"is required when format is {fmt}")
    batch = _batch(f)
    submit = _submit(f)
    return f.finish(
        SparkSinkSpec(
            format=cast(SparkFormat, fmt),
            path=path,
            jdbc=jdbc,
            iceberg=iceberg,
            partition_by=f.str_list("partitionBy"),
            transform=f.opt_str("transform"),
            sql=f.opt_str("sql"),
            batch=batch,
            submit=submit,
            packages=f.str_list("packages"),
        )
    )


def _jdbc(f: Fields) -> JdbcSpec | None:
    """spec.sink.spark.jdbc: the table, and its password from a Secret only."""
    j = f.sub("jdbc")
    if j is None:
        return None
    if j.has("password"):
        raise ConfigError(
            j.at("password"),
            "must not be inline (it would be stored in plain text in the pipeline and its "
            "ConfigMap): name a Secret key in jdbc.passwordSecretRef {name, key}, or a "
            "Secret with user and password in jdbc.secretRef",
        )
    jdbc = JdbcSpec(
        url=j.text("url"),
        table=j.text("table"),
        secret_ref=secret_ref(j.sub("secretRef")),
        user=j.opt_str("user"),
        password_secret_ref=secret_key_ref(j.sub("passwordSecretRef")),
    )
    no_url_credentials(j, "url", jdbc.url, "jdbc.passwordSecretRef or jdbc.secretRef")
    j.done()
    if jdbc.secret_ref is not None and jdbc.password_secret_ref is not None:
        raise ConfigError(
            j.at("passwordSecretRef"), "set either secretRef or passwordSecretRef, not both"
        )
    return jdbc


def _iceberg(f: Fields) -> IcebergSpec | None:
    """spec.sink.spark.iceberg: a namespace.table in a catalog, its password from a Secret."""
    ice = f.sub("iceberg")
    if ice is None:
        return None
    iceberg = IcebergSpec(
        table=ice.text("table"),
        catalog_uri=ice.text("catalogUri"),
        password_secret_ref=secret_key_ref(ice.sub("passwordSecretRef")),
    )
    no_url_credentials(ice, "catalogUri", iceberg.catalog_uri, "iceberg.passwordSecretRef")
    ice.done()
    if "." not in iceberg.table.strip("."):
        raise ConfigError(ice.at("table"), f"{iceberg.table!r} must be namespace.table")
    return iceberg


def _batch(f: Fields) -> SparkBatchSpec:
    b = f.section("batch")
    batch = SparkBatchSpec(
        max_records=b.integer("maxRecords"),
        max_interval_seconds=b.number("maxIntervalSeconds"),
        max_bytes=b.integer("maxBytes"),
    )
    b.done()
    return batch


def _submit(f: Fields) -> SparkSubmitSpec:
    """spec.sink.spark.submit: where the batch jobs run (local, connect, kubernetes)."""
    s = f.section("submit")
    mode = s.choice("mode")
    cluster_only = [k for k in ("image", "serviceAccount", "server", "executors") if k in s.raw]
    if mode != "kubernetes" and cluster_only:
        raise ConfigError(s.at(cluster_only[0]), "is only used when mode is kubernetes")
    if mode == "kubernetes" and "connectUrl" in s.raw:
        raise ConfigError(
            s.at("connectUrl"),
            "is not used when mode is kubernetes (the operator runs the pipeline's Spark "
            "Connect server); use mode connect for a server of your own",
        )
    srv = s.section("server")
    server = SparkServerSpec(cores=srv.integer("cores"), memory=_spark_memory(srv, "memory"))
    srv.done()
    ex = s.section("executors")
    executors = SparkExecutorsSpec(
        instances=ex.integer("instances"),
        cores=ex.integer("cores"),
        memory=_spark_memory(ex, "memory"),
    )
    ex.done()
    conf = s.str_map("conf")
    for name in conf:
        if is_secret_spark_property(name):
            raise ConfigError(
                map_key(s.at("conf"), name),
                "looks like a secret and must not be inline (it would be stored in plain text "
                "in the pipeline and its ConfigMap): pass it from a Secret as an environment "
                "variable in spec.template.spec.env (s3a reads AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY)",
            )
    submit = SparkSubmitSpec(
        mode=cast(SparkMode, mode),
        master=s.text("master"),
        connect_url=s.opt_str("connectUrl"),
        token_secret_ref=secret_key_ref(s.sub("tokenSecretRef")),
        conf=conf,
        image=s.opt_str("image"),
        service_account=s.opt_str("serviceAccount"),
        server=server,
        executors=executors,
    )
    s.done()
    no_url_credentials(s, "connectUrl", submit.connect_url, "submit.tokenSecretRef")
    if submit.token_secret_ref is not None and mode != "connect":
        raise ConfigError(
            s.at("tokenSecretRef"),
            "is only used when mode is connect (the token of a Spark Connect server of your own)",
        )
    check_submit_conf(submit.conf, s.at("conf"))
    if mode == "connect" and submit.connect_url is None:
        raise ConfigError(s.at("connectUrl"), "is required when mode is connect")
    return submit


def _spark_memory(f: Fields, key: str) -> str:
    """A Spark memory size (``spark.driver.memory`` syntax: 512m, 2g)."""
    text = f.text(key)
    if not re.fullmatch(r"[0-9]+[kmgtKMGT]?", text):
        raise ConfigError(f.at(key), f"{text!r} is not a Spark memory size such as 512m or 2g")
    return text
