#!/usr/bin/env bash
# The embedded default, end to end: set up, then run examples/kafka-to-kafka.yaml against a
# local Kafka with sample events and print what happened. Extra arguments go to the demo
# (e.g. --records 100000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${OFFTAKE_VENV:-.venv}
export VIRTUAL_ENV="$PWD/$VENV"
export PATH="$VIRTUAL_ENV/bin:$PATH"
printf '\n== demo\n'
exec "$VIRTUAL_ENV/bin/python" -m offtake_testbed.demo "$@"
