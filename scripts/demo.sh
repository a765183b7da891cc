#!/usr/bin/env bash
# The embedded default, end to end: set up, then run examples/kafka-to-kafka.yaml against a
# local Kafka with sample events and print what happened. Extra arguments go to the demo
# (e.g. --records 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m offtake_testbed.demo "$@"
