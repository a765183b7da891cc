#!/usr/bin/env bash
# Set up a machine for Offtake: the Python packages (editable), then the real components the
# demo and the tests use, installed from package registries and cached in ~/.cache/offtake
# ($OFFTAKE_CACHE). Idempotent: a second run takes seconds.
#
#   scripts/setup.sh          Python packages + Kafka (enough for the demo)
#   scripts/setup.sh --all    also Prometheus and PostgreSQL (Debian), and the Kubernetes
#                             control plane and helm built from the Go module proxy
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { printf '\n== %s\n' "$*"; }

step "Python packages"
"$PY" -m pip install -q --disable-pip-version-check -e '.[operator,spark,test]'

step "Apache Kafka (Maven Central jars)"
"$PY" -m offtake_testbed.kafka install

if [ "${1:-}" = "--all" ]; then
  step "Prometheus and promtool (Debian)"
  "$PY" -m offtake_testbed.prometheus install
  step "PostgreSQL (Debian)"
  "$PY" -c "from offtake_testbed.postgres import install_postgres; print(install_postgres())"
  step "kube-apiserver, etcd, kube-controller-manager, kubectl, helm (Go module proxy)"
  "$PY" -m offtake_testbed.kube install
fi
