#!/usr/bin/env bash
# Build and cache the Kubernetes test bed (kube-apiserver, kube-controller-manager, kubectl,
# etcd, helm) from source through the Go module proxy. Idempotent: reruns take under a second.
# The first run needs Go >= 1.24 and 10-25 minutes on two cores. Needs .venv (scripts/setup.sh).
#
#   scripts/install-kube.sh [--version v1.34.4] [--no-helm]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${OFFTAKE_VENV:-.venv}/bin/python" -m offtake_testbed.kube install "$@"
