"""Kafka to Parquet: the Offtake worker's Spark sink against Spark Structured Streaming.

    python bench/spark_vs_structured_streaming.py [--records 200000] [--batch 50000] [--rounds 3]

One run, one broker, one topic; each round runs both sides back to back (alternating which
goes first) and the output gives medians and each round's ratio:

- the anchor, what a Spark user would write: a Structured Streaming query reading the topic
  with spark-sql-kafka (from Maven Central), parsing the JSON value and writing Parquet with
  ``Trigger.AvailableNow``, started with ``spark-submit --packages`` and timed from submit until
  the process finished. Spark 4.3 has no spark-sql-kafka build that resolves on Maven Central,
  so the anchor runs in its own virtualenv (cached under ``$OFFTAKE_CACHE/venvs``) with the
  newest pyspark whose connector does: the output names both Spark versions;
- ``offtake worker`` (pyspark of this environment) as a process, with ``sink.spark`` writing
  Parquet, timed from start until the group's committed offsets reach the log end, that is,
  until every batch was written *and* committed; then stopped with SIGTERM;
- the same worker with ``format: iceberg`` (a SQLite SQL catalog beside the warehouse), read
  back through pyiceberg.

Both write the same columns (the Kafka metadata and the JSON fields) with the same master and
conf, and both outputs are read back (row count and distinct ids), so a fast wrong answer
shows. Also reported: each side's time without its JVM start (the query alone; the worker from
"Spark session ready" on, though it consumes while the JVM starts) and the worker's Spark job
time per batch.

The anchor's job is this same file run by the anchor's ``spark-submit`` (``--sss-job``), so
the module imports only the standard library at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from offtake_testbed.process import free_port

PARTITIONS = 4
MASTER = "local[2]"
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
}
# (pyspark, Scala suffix of spark-sql-kafka), newest first; the first whose connector fully
# resolves is used. On this machine's view of Maven Central 4.0.1 (and 4.1.1, 4.2.x) lack
# spark-token-provider-kafka, so 4.0.0 runs. 3.5 is built for Scala 2.12.
ANCHOR_CANDIDATES = (("4.0.1", "2.13"), ("4.0.0", "2.13"), ("3.5.7", "2.12"))
RESOLUTIONS = "anchor-resolutions.json"
ICEBERG_TABLE = "bench.orders"
SIDES = ("sss", "offtake", "iceberg")


def cache_root() -> Path:
    return Path(os.environ.get("OFFTAKE_CACHE", Path.home() / ".cache" / "offtake"))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- the anchor's job: runs inside the anchor's spark-submit ---------------------------------
def sss_job(bootstrap: str, topic: str, path: str) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    began = time.monotonic()
    spark = SparkSession.builder.appName("bench-structured-streaming").getOrCreate()
    session_seconds = time.monotonic() - began
    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("customer", StringType()),
            StructField("amount", DoubleType()),
            StructField("pad", StringType()),
        ]
    )
    began = time.monotonic()
    src = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = src.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        F.from_json(F.col("value").cast("string"), schema).alias("v"),
    ).select("topic", "partition", "offset", "timestamp", "key", "v.*")
    query = (
        rows.writeStream.format("parquet")
        .option("path", path)
        .option("checkpointLocation", path + "_checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    processing = time.monotonic() - began
    input_rows = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    version = spark.version
    spark.stop()
    print(
        "SSS_RESULT "
        + json.dumps(
            {
                "spark_version": version,
                "session_start_seconds": session_seconds,
                "processing_seconds": processing,
                "input_rows": input_rows,
            }
        ),
        flush=True,
    )


# -- the anchor's environment ----------------------------------------------------------------
def anchor_venv(version: str) -> Path:
    """A virtualenv with pyspark ``version`` (created once, then reused)."""
    venv = cache_root() / "venvs" / f"pyspark-{version}"
    python = venv / "bin" / "python"
    if python.exists() and _pyspark_home(venv) is not None:
        return venv
    log(f"creating {venv} with pyspark=={version} (once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"pyspark=={version}"],
        check=True,
        cwd=venv,
    )
    return venv


def _pyspark_home(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python*/site-packages/pyspark/bin/spark-submit"))
    return found[0].parent.parent if found else None


def run_anchor(
    version: str, scala: str, bootstrap: str, topic: str, path: str, work: Path
) -> dict[str, Any]:
    """spark-submit the Structured Streaming job in the anchor's venv; time it."""
    venv = anchor_venv(version)
    home = _pyspark_home(venv)
    assert home is not None
    package = f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--master",
        MASTER,
        "--packages",
        package,
        # Ivy's cache outside the repository, shared with the worker's connectors.
        "--conf",
        f"spark.jars.ivy={cache_root() / 'ivy'}",
    ]
    for key, value in SPARK_CONF.items():
        cmd += ["--conf", f"{key}={value}"]
    cmd += [str(Path(__file__).resolve()), "--sss-job", bootstrap, topic, path]
    python = str(venv / "bin" / "python")
    # The driver must be the venv's Python (its pyspark matches the JVM), not ours.
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "SPARK_REMOTE")
    }
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    out_path = work / f"sss-{version}.log"
    began = time.monotonic()
    with out_path.open("wb") as out:
        code = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work
        ).returncode
    wall = time.monotonic() - began
    text = out_path.read_text(errors="replace")
    result = next(
        (json.loads(line[11:]) for line in text.splitlines() if line.startswith("SSS_RESULT ")),
        None,
    )
    if code != 0 or result is None:
        unresolved = "unresolved dependency" in text or "download failed" in text.lower()
        raise AnchorFailed(package, unresolved, text[-3000:])
    return {"package": package, "wall_seconds": wall, **result}


class AnchorFailed(Exception):
    def __init__(self, package: str, unresolved: bool, tail: str) -> None:
        super().__init__(f"{package}: {'does not resolve' if unresolved else 'job failed'}")
        self.package, self.unresolved, self.tail = package, unresolved, tail


def resolves(package: str, work: Path) -> bool:
    """Whether ``package`` and its dependencies resolve on Maven Central (Ivy, cached).

    Checked with this environment's spark-submit and an empty script, before a virtualenv
    with another pyspark is downloaded for it; the answer is remembered in the cache.
    """
    import pyspark

    memo = cache_root() / "venvs" / RESOLUTIONS
    known: dict[str, bool] = json.loads(memo.read_text()) if memo.exists() else {}
    if package in known:
        return known[package]
    empty = work / "empty.py"
    empty.write_text("")
    home = Path(pyspark.__file__).parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_REMOTE")}
    env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(
        [
            str(home / "bin" / "spark-submit"),
            "--packages",
            package,
            "--conf",
            f"spark.jars.ivy={cache_root() / 'ivy'}",
            str(empty),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        check=False,
    )
    ok = done.returncode == 0
    if not ok:
        lines = [ln.strip(" :\t") for ln in done.stderr.splitlines() if ":: org." in ln]
        log(f"{package} does not resolve: {lines[:3] or done.stderr[-500:]}")
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({**known, package: ok}, indent=2))
    return ok


def run_anchor_any(bootstrap: str, topic: str, path: str, work: Path) -> dict[str, Any]:
    """The newest candidate whose connector resolves; its venv is created on first use."""
    tried: list[str] = []
    for version, scala in ANCHOR_CANDIDATES:
        package = f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version}"
        if not resolves(package, work):
            tried.append(f"{package}: does not resolve")
            continue
        try:
            result = run_anchor(version, scala, bootstrap, topic, path, work)
        except AnchorFailed as exc:
            log(f"structured streaming with {exc}; last output:\n{exc.tail}")
            tried.append(str(exc))
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(path + "_checkpoint", ignore_errors=True)
            continue
        result["tried"] = tried
        return result
    raise RuntimeError(f"no Structured Streaming anchor ran: {tried}")


# -- Offtake ---------------------------------------------------------------------------------


def pipeline_doc(
    bootstrap: str, topic: str, group: str, path: str, batch: int, fmt: str = "parquet"
) -> dict[str, Any]:
    sink: dict[str, Any] = {
        "format": fmt,
        "path": path,
        "batch": {"maxRecords": batch, "maxIntervalSeconds": 2},
        "submit": {"mode": "local", "master": MASTER, "conf": dict(SPARK_CONF)},
    }
    if fmt == "iceberg":
        # A SQLite catalog beside the warehouse (Iceberg's JDBC catalog schema).
        sink["iceberg"] = {"table": ICEBERG_TABLE, "catalogUri": f"sqlite:///{path}.db"}
    return {
        "apiVersion": "offtake.dev/v1alpha1",
        "kind": "ConsumerPipeline",
        "metadata": {"name": "bench-spark", "namespace": "bench"},
        "spec": {
            "kafka": {"bootstrapServers": bootstrap},
            "source": {"topics": [topic], "groupId": group, "format": "json"},
            "sink": {"spark": sink},
            # Commit as soon as a batch is done: the clock stops at the last commit.
            "commit": {"intervalSeconds": 0.2},
            "limits": {"maxInFlightMessages": batch * PARTITIONS * 2, "maxInFlightBytes": 1 << 30},
        },
    }


def scrape(port: int) -> dict[str, float]:
    """Sum each sample name over its labels, from the worker's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_offtake(
    bootstrap: str, topic: str, path: str, batch: int, work: Path, fmt: str = "parquet"
) -> dict[str, Any]:
    import yaml
    from confluent_kafka import Consumer, TopicPartition

    group = f"bench-{uuid.uuid4().hex[:8]}"
    manifest = work / f"pipeline-{fmt}.yaml"
    manifest.write_text(yaml.safe_dump(pipeline_doc(bootstrap, topic, group, path, batch, fmt)))
    port = free_port()
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    ends = sum(probe.get_watermark_offsets(tp, timeout=10)[1] for tp in tps)
    out_path = work / f"offtake-{fmt}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "SPARK_REMOTE")}
    cmd = [sys.executable, "-m", "offtake.cli", "worker", "--pipeline", str(manifest)]
    cmd += ["--metrics-port", str(port)]
    began = time.monotonic()
    ready_at: float | None = None
    with out_path.open("wb") as out:
        # cwd outside the repository: its operator/ folder must not shadow the stdlib module.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited: {out_path.read_text()[-3000:]}")
                if ready_at is None and "Spark session ready" in out_path.read_text(
                    errors="replace"
                ):
                    ready_at = time.monotonic()
                done = sum(max(0, tp.offset) for tp in probe.committed(tps, timeout=10))
                if done >= ends:
                    break
                time.sleep(0.05)
            wall = time.monotonic() - began
            metrics = scrape(port)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            probe.close()
    if code != 0:
        raise RuntimeError(f"the worker exited {code}: {out_path.read_text()[-3000:]}")
    session = next(
        (
            float(json.loads(line)["message"].split(" in ")[1].rstrip("s"))
            for line in out_path.read_text(errors="replace").splitlines()
            if "Spark session ready" in line and line.startswith("{")
        ),
        None,
    )
    jobs = metrics.get("offtake_spark_job_duration_seconds_count", 0.0)
    return {
        "wall_seconds": wall,
        "after_session_ready_seconds": None if ready_at is None else wall - (ready_at - began),
        "session_start_seconds": session,
        "spark_jobs": int(jobs),
        "spark_job_seconds_total": metrics.get("offtake_spark_job_duration_seconds_sum"),
        "rows_per_batch_mean": (
            metrics.get("offtake_spark_batch_records_sum", 0.0) / jobs if jobs else None
        ),
    }


# -- the run ---------------------------------------------------------------------------------
def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    from offtake.kafka.produce import produce_waiting

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        value = {"id": i, "customer": f"c{i % 97}", "amount": i * 0.5, "pad": "x" * 100}
        payload = json.dumps(value).encode()
        produce_waiting(producer, topic, value=payload, key=str(i).encode())
    assert producer.flush(60) == 0


def read_back_iceberg(path: str) -> tuple[int, int]:
    """Rows and distinct ids of the Iceberg table, read through its catalog with pyiceberg."""
    import pyarrow.compute as pc
    from pyiceberg.catalog.sql import SqlCatalog

    from offtake.sinks.spark.iceberg import CATALOG_NAME

    catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{path}.db", warehouse=path)
    ids = catalog.load_table(ICEBERG_TABLE).scan(selected_fields=("id",)).to_arrow()["id"]
    return len(ids), len(pc.unique(ids))


def read_back(path: str) -> tuple[int, int]:
    """Rows and distinct ids of a Parquet output, read with pyarrow (no JVM).

    Only the data files: not Offtake's staging folder, not Spark's stream metadata, and not
    ``_SUCCESS`` markers (Offtake's batch folders start with '_', so pyarrow's default of
    skipping such names cannot be used).
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    skip = ("_offtake_staging", "_spark_metadata")
    files = [
        str(f)
        for f in Path(path).rglob("*.parquet")
        if not any(part in skip for part in f.relative_to(path).parts)
    ]
    ids = ds.dataset(files, format="parquet").to_table(columns=["id"])["id"]
    return len(ids), len(pc.unique(ids))


def rate(records: int, seconds: float | None) -> int | None:
    return None if not seconds else round(records / seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50_000, help="Offtake's batch.maxRecords")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each side, alternating which goes first; medians are reported",
    )
    parser.add_argument(
        "--no-class-archive",
        action="store_true",
        help="run the worker without the class-data archive of `offtake spark-archive`",
    )
    args = parser.parse_args()

    import pyspark

    from offtake_testbed.kafka import KafkaBroker

    n = args.records
    work = Path(tempfile.mkdtemp(prefix="offtake-bench-spark-"))
    rounds: list[dict[str, dict[str, Any]]] = []
    archive = prepare_class_archive(not args.no_class_archive, work)
    try:
        with KafkaBroker() as broker:
            topic = "bench-spark"
            broker.create_topic(topic, PARTITIONS)
            began = time.monotonic()
            fill(broker.bootstrap, topic, n)
            log(f"produced {n:,} records in {time.monotonic() - began:.1f}s")
            for r in range(args.rounds):
                # Alternate the order, so that whatever the first run of a round warms (the page
                # cache, the Ivy cache) favours each side equally often.
                rdir = work / f"round{r}"
                rdir.mkdir()
                got: dict[str, dict[str, Any]] = {}
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    out = str(rdir / side)
                    if side == "sss":
                        got[side] = run_anchor_any(broker.bootstrap, topic, out, rdir)
                        got[side]["rows_written"], got[side]["distinct_ids"] = read_back(out)
                    elif side == "offtake":
                        got[side] = run_offtake(broker.bootstrap, topic, out, args.batch, rdir)
                        got[side]["rows_written"], got[side]["distinct_ids"] = read_back(out)
                    else:
                        got[side] = run_offtake(
                            broker.bootstrap, topic, out, args.batch, rdir, "iceberg"
                        )
                        written = read_back_iceberg(out)
                        got[side]["rows_written"], got[side]["distinct_ids"] = written
                log(
                    f"round {r + 1}: structured streaming ({got['sss']['spark_version']}) "
                    f"{got['sss']['wall_seconds']:.1f}s, offtake worker (pyspark "
                    f"{pyspark.__version__}) parquet {got['offtake']['wall_seconds']:.1f}s, "
                    f"iceberg {got['iceberg']['wall_seconds']:.1f}s"
                )
                rounds.append(got)
        result = summary(n, args.batch, pyspark.__version__, rounds)
        result["offtake"]["class_archive"] = archive
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_class_archive(use: bool, work: Path) -> str | None:
    """The worker's class-data archive, made first if missing (as `offtake spark-archive`
    does, which scripts/setup.sh runs), or hidden from the workers with --no-class-archive."""
    from offtake.sinks.spark.class_archive import ARCHIVES_ENV, archive_path

    if not use:
        os.environ[ARCHIVES_ENV] = str(work / "no-archives")
        return None
    path = archive_path()
    if path is not None and not path.is_file():
        log("making the worker's class-data archive: offtake spark-archive (once)")
        cmd = [sys.executable, "-m", "offtake.cli", "spark-archive"]
        subprocess.run(cmd, check=True, cwd=work, stdout=subprocess.DEVNULL)
    return None if path is None else str(path)


def summary(
    n: int, batch: int, version: str, rounds: list[dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    off = [r["offtake"] for r in rounds]
    sss = [r["sss"] for r in rounds]
    ice = [r["iceberg"] for r in rounds]

    def each(runs: list[dict[str, Any]], key: str) -> list[Any]:
        return [_round(r[key]) if isinstance(r[key], float) else r[key] for r in runs]

    def median_rate(runs: list[dict[str, Any]], key: str) -> int | None:
        rates = [rate(n, r[key]) for r in runs]
        known = [x for x in rates if x is not None]
        return round(statistics.median(known)) if known else None

    # Each round's two runs share the machine's conditions: compare within a round.
    ratios = [
        _ratio(rate(n, o["wall_seconds"]), rate(n, s["wall_seconds"]))
        for o, s in zip(off, sss, strict=True)
    ]
    iceberg_ratios = [
        _ratio(rate(n, i["wall_seconds"]), rate(n, s["wall_seconds"]))
        for i, s in zip(ice, sss, strict=True)
    ]
    net = [
        _ratio(rate(n, o["after_session_ready_seconds"]), rate(n, s["processing_seconds"]))
        for o, s in zip(off, sss, strict=True)
    ]
    anchor = sss[0]["spark_version"]
    return {
        "records": n,
        "partitions": PARTITIONS,
        "master": MASTER,
        "cpus": os.cpu_count(),
        "rounds": len(rounds),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "offtake": {
            "spark_version": version,
            "batch_max_records": batch,
            "rows_per_second_median": median_rate(off, "wall_seconds"),
            "rows_per_second_after_session_ready_median": median_rate(
                off, "after_session_ready_seconds"
            ),
            "seconds_start_to_committed": each(off, "wall_seconds"),
            "seconds_after_session_ready": each(off, "after_session_ready_seconds"),
            "session_start_seconds": each(off, "session_start_seconds"),
            "spark_jobs": each(off, "spark_jobs"),
            "spark_job_seconds_total": each(off, "spark_job_seconds_total"),
            "rows_written": each(off, "rows_written"),
            "distinct_ids": each(off, "distinct_ids"),
        },
        "offtake_iceberg": {
            "rows_per_second_median": median_rate(ice, "wall_seconds"),
            "seconds_start_to_committed": each(ice, "wall_seconds"),
            "spark_jobs": each(ice, "spark_jobs"),
            "spark_job_seconds_total": each(ice, "spark_job_seconds_total"),
            "rows_written": each(ice, "rows_written"),
            "distinct_ids": each(ice, "distinct_ids"),
        },
        "structured_streaming": {
            "spark_version": anchor,
            "package": sss[0]["package"],
            "trigger": "AvailableNow",
            "rows_per_second_median": median_rate(sss, "wall_seconds"),
            "rows_per_second_processing_median": median_rate(sss, "processing_seconds"),
            "seconds_submit_to_finished": each(sss, "wall_seconds"),
            "seconds_processing": each(sss, "processing_seconds"),
            "session_start_seconds": each(sss, "session_start_seconds"),
            "input_rows": each(sss, "input_rows"),
            "rows_written": each(sss, "rows_written"),
            "distinct_ids": each(sss, "distinct_ids"),
            "candidates_that_failed": sss[0]["tried"],
        },
        "ratio_offtake_vs_structured_streaming": {
            "per_round": ratios,
            "median": _median(ratios),
        },
        "ratio_iceberg_vs_structured_streaming": {
            "per_round": iceberg_ratios,
            "median": _median(iceberg_ratios),
        },
        "ratio_without_jvm_start": {"per_round": net, "median": _median(net)},
        "every_record_once": all(
            r["rows_written"] == n and r["distinct_ids"] == n for r in off + ice + sss
        ),
        "note": (
            f"Versions differ: Offtake ran on Spark {version}, the anchor on Spark {anchor} "
            "(the newest whose spark-sql-kafka resolves on Maven Central here). Ratios are "
            "Offtake's rows/s over the anchor's, within each round. Wall times include each "
            "side's JVM start (the anchor's also Ivy resolution from the cache). 'Without JVM "
            "start': the anchor's query alone; the worker from 'Spark session ready' on, but it "
            "consumed and decoded while its JVM started, which that figure does not charge. "
            "The worker maps the class-data archive of `offtake spark-archive` (offtake."
            "class_archive: null when run with --no-class-archive)."
        ),
    }


def _median(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return round(statistics.median(known), 2) if known else None


def _round(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def _ratio(a: int | None, b: int | None) -> float | None:
    return None if not a or not b else round(a / b, 2)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--sss-job":
        sss_job(*sys.argv[2:])
    else:
        main()
