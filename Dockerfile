# Offtake's images, one Dockerfile with three targets:
#
#   operator      offtake-operator only (kopf, kubernetes): no worker extras, no JRE, no Spark
#   worker        offtake worker with the Kafka, log and sidecar sinks, and the example
#                 functions (offtake_examples); no pyspark, no JRE
#   worker-spark  the worker plus pyspark and a headless JRE 17 (sink.spark in any mode)
#
# The base is always pinned by digest: BASE_DIGEST has no default and a build without it stops
# at the first FROM ("invalid reference format"). Read the digest of the tag you want with any of
#   crane digest python:3.11-slim-bookworm
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/python:3.11-slim-bookworm
#   docker buildx imagetools inspect python:3.11-slim-bookworm     (the "Digest:" line)
# and build each target with it:
#   docker build --build-arg BASE_DIGEST=sha256:... --target operator -t offtake-operator:0.1.0 .
#   docker build --build-arg BASE_DIGEST=sha256:... --target worker -t offtake-worker:0.1.0 .
#   docker build --build-arg BASE_DIGEST=sha256:... --target worker-spark \
#       -t offtake-worker-spark:0.1.0 .
# Any Debian bookworm image with python3 (3.11+) and python3-venv works as BASE_IMAGE:
# scripts/build-image.sh builds one from Debian's packages (mmdebstrap) and builds these targets
# with buildah, without a Docker engine.
#
# What runs here writes only under /tmp and $HOME (/home/offtake, uid 10001): the pods the
# operator renders and the chart's operator Deployment have a read-only root filesystem with an
# emptyDir at /tmp, and set HOME=/tmp for the worker, so Spark's ivy cache
# ($HOME/.cache/offtake/ivy, or $OFFTAKE_CACHE/ivy) lands in that emptyDir. OFFTAKE_CACHE is
# deliberately not set here: it would point the cache at the read-only image instead.
#
# Your processing functions: build FROM the worker (or worker-spark) image, switch to root to
# pip install your package into /opt/offtake, then back to USER 10001:10001.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG BASE_DIGEST

FROM ${BASE_IMAGE}@${BASE_DIGEST} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LANG=C.UTF-8

# -- the wheels ------------------------------------------------------------------------------
# The test bed never reaches an image: this context has no testbed/ (.dockerignore, and no COPY
# names it), so pyproject's package find over worker/, operator/ and testbed/ finds only
# offtake and offtake_operator, and the wheel has no offtake_testbed (tests/image checks it).
FROM base AS build
WORKDIR /src
RUN python3 -m venv /opt/build
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY operator ./operator
COPY examples/pyproject.toml ./examples/pyproject.toml
COPY examples/offtake_examples ./examples/offtake_examples
RUN /opt/build/bin/pip wheel --no-deps --wheel-dir /wheels . ./examples

# -- one virtual environment per target, made in a throwaway stage (no wheels left behind) ---
FROM base AS venv
RUN python3 -m venv /opt/offtake
ENV PATH=/opt/offtake/bin:$PATH
COPY --from=build /wheels /wheels

FROM venv AS operator-venv
RUN pip install "$(echo /wheels/offtake-[0-9]*.whl)[operator]"

FROM venv AS worker-venv
# offtake_examples: the functions the examples/ manifests name (offtake_examples.enrich:handle).
RUN pip install /wheels/offtake-[0-9]*.whl /wheels/offtake_examples-*.whl

FROM worker-venv AS worker-spark-venv
RUN pip install "$(echo /wheels/offtake-[0-9]*.whl)[spark]"

# -- what every target runs as ---------------------------------------------------------------
FROM base AS runtime
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/offtake \
        --shell /usr/sbin/nologin offtake \
    && mkdir -p /home/offtake/.cache/offtake \
    && chown -R 10001:10001 /home/offtake
ENV PATH=/opt/offtake/bin:$PATH \
    HOME=/home/offtake
WORKDIR /home/offtake

FROM runtime AS operator
COPY --from=operator-venv /opt/offtake /opt/offtake
USER 10001:10001
# 8080: /healthz (liveness); 8081: the operator's /metrics.
EXPOSE 8080 8081
CMD ["offtake-operator"]

FROM runtime AS worker-spark
# The JRE is not version-pinned (DL3008): Debian's mirror keeps only the current build of each
# package, so a pinned version stops building at the next security update; the base's digest
# fixes the release (bookworm) and so the major version.
# man1: slim bases drop /usr/share/man, and the JRE's post-install (update-alternatives for
# java.1.gz) fails without that folder.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=worker-spark-venv /opt/offtake /opt/offtake
# Spark's classes, parsed and verified once, in a class-data archive that every local session
# maps: it starts in about half the time (docs/spark-sink.md, "JVM start"). Made for this
# image's JVM and jars; its training run's scratch (Ivy, /tmp) is left out of the layer.
ENV OFFTAKE_SPARK_ARCHIVES=/opt/offtake/spark-archives
# SPARK_LOCAL_IP: the run is local[2], and Spark otherwise resolves the build container's
# hostname, which buildah's chroot isolation does not put in /etc/hosts (UnknownHostException).
RUN SPARK_LOCAL_IP=127.0.0.1 HOME=/tmp/offtake-build offtake spark-archive \
    && rm -rf /tmp/offtake-build /tmp/offtake-spark-archive-* /tmp/hsperfdata_root
USER 10001:10001
# 9100: /metrics, /healthz, /readyz (spec.metrics.port).
EXPOSE 9100
CMD ["offtake", "worker", "--pipeline", "/etc/offtake/pipeline.yaml"]

# Last, so a build without --target gives the plain worker.
FROM runtime AS worker
COPY --from=worker-venv /opt/offtake /opt/offtake
USER 10001:10001
EXPOSE 9100
CMD ["offtake", "worker", "--pipeline", "/etc/offtake/pipeline.yaml"]
