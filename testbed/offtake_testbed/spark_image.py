"""The Spark image for Spark on Kubernetes in the node tier: the server and executor pods that
the Kubeflow Spark operator (its SparkConnect) and Spark's own Kubernetes scheduler start.

``apache/spark`` is on Docker Hub, which this machine does not reach, so the image is made here
with buildah from scripts/build-image.sh's ``worker-spark`` image, which already holds Debian's
JRE 17 and the pyspark wheel (Spark's jars from Maven Central, including spark-connect and
spark-kubernetes, and its ``bin/`` and ``sbin/`` scripts). On top of it, what the two callers
expect of an ``apache/spark`` image (read from their sources):

- the SparkConnect controller (spark-operator v2.3.0,
  internal/controller/sparkconnect/reconciler.go) runs the server container as
  ``bash -c "${SPARK_HOME}/sbin/start-connect-server.sh --master k8s://... --conf ..."`` with
  ``SPARK_NO_DAEMONIZE=true``: so ``SPARK_HOME`` (the wheel's pyspark folder), and log and pid
  folders under /tmp, as SPARK_HOME is not writable by the pods' user;
- Spark's executor pods (KubernetesExecutorBuilder) give the container no command, only the
  argument ``executor`` and SPARK_* variables: the image's entry point turns them into
  ``KubernetesExecutorBackend``'s java command, as Spark's own
  resource-managers/kubernetes/docker/src/main/dockerfiles/spark/entrypoint.sh does;
- the pods run as uid/gid 185 (the operator's restricted contexts, apache/spark's ``spark``
  user): a passwd entry for it, since Hadoop's login asks the OS for the user's name.

Tagged ``localhost/offtake-spark:<version>`` in the same buildah storage; rebuilt when the
worker-spark image or this recipe changes (a label records both)::

    python -m offtake_testbed.spark_image build
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._cache import cache_lock
from .node.install import buildah_command

__all__ = ["SPARK_IMAGE", "WORKER_SPARK_IMAGE", "SparkImageError", "build_spark_image"]

WORKER_SPARK_IMAGE = "localhost/offtake-worker-spark:0.1.0"
SPARK_IMAGE = "localhost/offtake-spark:0.1.0"
SPARK_HOME = "/opt/offtake/lib/python3.11/site-packages/pyspark"
SPARK_UID = 185
_RECIPE = "1"
_RECIPE_LABEL = "dev.offtake.spark-image.recipe"

# Spark's executor entry point, as in Spark's Kubernetes Dockerfile's entrypoint.sh (only the
# executor branch: the server's command is the Spark operator's own).
ENTRYPOINT = r"""#!/bin/bash
set -eo pipefail
case "$1" in
  executor)
    shift 1
    # Spark passes the executor's JVM options as SPARK_JAVA_OPT_<n>, in order.
    env | grep SPARK_JAVA_OPT_ | sort -t_ -k4 -n | sed 's/[^=]*=\(.*\)/\1/g' > /tmp/java_opts.txt
    readarray -t SPARK_EXECUTOR_JAVA_OPTS < /tmp/java_opts.txt
    SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}${SPARK_HOME}/jars/*"
    exec java "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_CLASSPATH" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" \
      --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME" \
      "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
"""


class SparkImageError(RuntimeError):
    """The image could not be built (its base is missing, or a buildah step failed)."""


def _run(*args: str) -> str:
    proc = subprocess.run([*buildah_command(), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SparkImageError(f"buildah {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _label(image: str, key: str) -> str | None:
    proc = subprocess.run(
        [
            *buildah_command(),
            "inspect",
            "--type",
            "image",
            "--format",
            f'{{{{index .OCIv1.Config.Labels "{key}"}}}}',
            image,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _image_id(image: str) -> str | None:
    proc = subprocess.run(
        [*buildah_command(), "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_spark_image() -> str:
    """Build (or find) :data:`SPARK_IMAGE` from :data:`WORKER_SPARK_IMAGE`; return its name."""
    base_id = _image_id(WORKER_SPARK_IMAGE)
    if base_id is None:
        raise SparkImageError(
            f"{WORKER_SPARK_IMAGE} is not built: run scripts/build-image.sh --target worker-spark"
        )
    recipe = f"{_RECIPE}:{base_id}"
    if _label(SPARK_IMAGE, _RECIPE_LABEL) == recipe:
        return SPARK_IMAGE
    with cache_lock("spark-image"):
        if _label(SPARK_IMAGE, _RECIPE_LABEL) == recipe:
            return SPARK_IMAGE
        box = _run("from", "--pull-never", WORKER_SPARK_IMAGE)
        try:
            with tempfile.TemporaryDirectory(prefix="offtake-spark-image-") as tmp:
                entrypoint = Path(tmp) / "entrypoint.sh"
                entrypoint.write_text(ENTRYPOINT)
                entrypoint.chmod(0o755)
                _run("copy", "--chmod", "0755", box, str(entrypoint), "/opt/entrypoint.sh")
            _run("config", "--user", "0:0", box)
            _run(
                "run", "--isolation", "chroot", box, "--",
                "useradd", "--uid", str(SPARK_UID), "--user-group", "--no-create-home",
                "--home-dir", "/tmp", "--shell", "/bin/bash", "spark",
            )  # fmt: skip
            _run(
                "config",
                "--env", f"SPARK_HOME={SPARK_HOME}",
                "--env", "SPARK_LOG_DIR=/tmp/spark-logs",
                "--env", "SPARK_PID_DIR=/tmp",
                "--env", "PYSPARK_PYTHON=/opt/offtake/bin/python",
                "--env", "HOME=/tmp",
                "--workingdir", "/tmp",
                "--user", f"{SPARK_UID}:{SPARK_UID}",
                "--entrypoint", '["/opt/entrypoint.sh"]',
                "--cmd", "",
                "--label", f"{_RECIPE_LABEL}={recipe}",
                box,
            )  # fmt: skip
            _run("commit", "--quiet", box, SPARK_IMAGE)
        finally:
            subprocess.run([*buildah_command(), "rm", box], capture_output=True, check=False)
    return SPARK_IMAGE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m offtake_testbed.spark_image")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help=f"build {SPARK_IMAGE} from {WORKER_SPARK_IMAGE}")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            print(build_spark_image())
        except SparkImageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
