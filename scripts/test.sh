#!/usr/bin/env bash
# Everything CI runs: set up all components, static checks, then the whole test suite on the
# real components (Kafka, Spark, PostgreSQL, Prometheus, kube-apiserver). Extra arguments go
# to pytest (e.g. -k rebalance).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh --all
printf '\n== static checks\n'
bash scripts/lint.sh
printf '\n== tests\n'
# `pytest`, not `python -m pytest`: the latter puts the repository root on sys.path, where
# the folder operator/ would shadow the standard library's operator module.
exec pytest -p no:cacheprovider "$@"
