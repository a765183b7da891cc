#!/usr/bin/env bash
# Everything CI runs: set up all components, static checks, then the whole test suite on the
# real components (Kafka, Spark, PostgreSQL, Prometheus, kube-apiserver). Extra arguments go
# to pytest (e.g. -k rebalance).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
# The project's own environment first on PATH: the tests start `offtake`, `python` and the
# operator as subprocesses, and those must be .venv's, not whatever else is installed.
VENV=${OFFTAKE_VENV:-.venv}
export VIRTUAL_ENV="$PWD/$VENV"
export PATH="$VIRTUAL_ENV/bin:$PATH"
# A bare machine's control plane is still building (setup.sh --tests left it in the background):
# say so to the test processes, all alike, so that they hand out the files that need it last
# and wait for it in their fixture instead of at collection (offtake_testbed.pytest_plugin_kube).
if ! building=$("$VIRTUAL_ENV/bin/python" -m offtake_testbed.kube built); then
  export OFFTAKE_KUBE_BUILDING="$building"
  printf '\nthe Kubernetes control plane is still building (log: %s): its tests go last\n' \
    "$OFFTAKE_KUBE_BUILDING"
fi
printf '\n== static checks\n'
bash scripts/lint.sh
printf '\n== tests\n'
# `pytest`, not `python -m pytest`: the latter puts the repository root on sys.path, where
# the folder operator/ would shadow the standard library's operator module.
# --durations=25: CI prints the 25 slowest tests, so the suite's time is watched where it goes.
# -n: one pytest process per CPU (pytest-xdist; $OFFTAKE_TEST_PROCESSES overrides, 0 runs in
# this process). Most tests wait on real parts, so the processes overlap their waits; each
# process starts the shared parts it needs once (a broker, a control plane, a Spark session).
# --dist loadfile: a file's tests run in one process, in order, so module-scoped fixtures are
# made once per file as in a plain run.
processes=${OFFTAKE_TEST_PROCESSES:-$(nproc)}
exec "$VIRTUAL_ENV/bin/pytest" -p no:cacheprovider --durations=25 -n "$processes" \
  --dist loadfile "$@"
