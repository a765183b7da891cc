# The Offtake image: the worker (`offtake worker --pipeline /etc/offtake/pipeline.yaml`, the
# default command) and the operator (`offtake-operator`, which the Helm chart runs). One image
# for both, so the operator's default worker image is always its own.
#
#   docker build -t offtake:0.1.0 .
#   docker build --build-arg WITH_JAVA=0 -t offtake:0.1.0-nojvm .   # no local Spark: ~1 GB smaller
#
# Your processing functions: build FROM this image and pip install your package (as below for
# the examples), then point spec.image at the result.
FROM python:3.11-slim

# Spark's local mode (sink.spark.submit.mode: local) runs a JVM inside the worker.
ARG WITH_JAVA=1
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN if [ "$WITH_JAVA" = "1" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
      && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /opt/offtake/src
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY operator ./operator
# pyproject finds packages in all three folders, the test bed included, so it must be present.
COPY testbed ./testbed
# worker/offtake/config/consumerpipeline.yaml links to the CRD, which `offtake validate` reads.
COPY crds ./crds
RUN pip install ".[operator,spark]" \
    && cd / && rm -rf /opt/offtake/src

# The example functions (offtake_examples.enrich:handle) for the examples/ manifests and demos,
# installed as their own package (examples/pyproject.toml), the way you would install yours.
COPY examples/pyproject.toml /opt/offtake/examples/pyproject.toml
COPY examples/offtake_examples /opt/offtake/examples/offtake_examples
RUN pip install --no-deps /opt/offtake/examples && rm -rf /opt/offtake/examples

RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin offtake
USER 10001:10001
WORKDIR /tmp

# 9100: the worker's /metrics, /healthz, /readyz (spec.metrics.port); 8080: the operator's probe.
EXPOSE 9100 8080
ENTRYPOINT []
CMD ["offtake", "worker", "--pipeline", "/etc/offtake/pipeline.yaml"]
