#!/usr/bin/env bash
# Set up a machine for Offtake: check the prerequisites, create the project's own virtual
# environment .venv with the Python packages (editable, never into the system interpreter),
# then the real components the demo and the tests use, installed from package registries and
# cached in ~/.cache/offtake ($OFFTAKE_CACHE). Idempotent: a second run takes seconds.
#
#   scripts/setup.sh          Python packages + Kafka (enough for the demo)
#   scripts/setup.sh --all    also the Spark class-data archive (the Spark tests' local
#                             sessions start from it), Prometheus and PostgreSQL (Debian),
#                             the schema registry (Apicurio, built from Maven Central), and
#                             the Kubernetes control plane and helm built from the Go module
#                             proxy, and the manifest scanners scripts/lint.sh runs
#                             (kube-score, kubeconform, checkov)
#   scripts/setup.sh --tests  --all as scripts/test.sh needs it: the Kubernetes control plane,
#                             the long pole of a bare machine (10-20 minutes of Go builds on
#                             two cores), goes on building in the background while the tests
#                             that do not need it run; those that do wait for it (the fixtures
#                             of offtake_testbed.pytest_plugin_kube). Its output goes to
#                             ~/.cache/offtake/kube/background-build.log
#   scripts/setup.sh --node   --all, and the real node's parts for tests/node (kubelet,
#                             containerd, runc, CNI plugins, prometheus-adapter from the Go
#                             module proxy; gcc, pkg-config, libseccomp-dev from Debian)
#
# Afterwards `source .venv/bin/activate` puts `offtake`, `python` and `pytest` of .venv first
# on PATH. $OFFTAKE_VENV chooses another folder for the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
VENV=${OFFTAKE_VENV:-.venv}
setup_started=$EPOCHREALTIME

step_started=""
step() {
  step_done
  printf '\n== %s\n' "$*"
  step_started=$EPOCHREALTIME
}
step_done() {
  if [[ -n $step_started ]]; then
    printf '   (%.1fs)\n' "$(bc_sub "$EPOCHREALTIME" "$step_started")"
  fi
  step_started=""
}
# Seconds between two $EPOCHREALTIME values, without bc (not on every machine).
bc_sub() {
  local a=${1/[.,]/} b=${2/[.,]/}
  local us=$((10#$a - 10#$b))
  printf '%d.%06d' $((us / 1000000)) $((us % 1000000))
}

# shellcheck source=scripts/prereqs.sh
source scripts/prereqs.sh
check_prereqs "$MODE" || exit 1

# -- Python packages into .venv -------------------------------------------------------------
# What is installed is a function of the two pyproject files and the interpreter: a stamp of
# them in the environment lets a rerun skip the installer entirely.
stamp() {
  cat pyproject.toml examples/pyproject.toml
  "$VENV/bin/python" -c 'import sys; print(sys.version)'
}
stamp_file="$VENV/.offtake-installed"

step "Python environment $VENV"
if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c '' 2>/dev/null; then
  echo "found $VENV ($("$VENV/bin/python" -V))"
else
  rm -rf "$VENV"
  echo "creating $VENV with $BOOT_PYTHON (python $BOOT_PYTHON_VERSION)"
  "$BOOT_PYTHON" -m venv "$VENV"
fi

step "Python packages: offtake[operator,spark,test,kubectl] and examples/ (editable) into $VENV"
if [[ -f $stamp_file ]] && [[ "$(cat "$stamp_file")" == "$(stamp)" ]]; then
  echo "found them installed for this pyproject.toml (cached; delete $stamp_file to reinstall)"
else
  # uv (from PyPI, into .venv only) resolves and downloads in parallel: a cold install takes
  # about a minute instead of several with pip. pip is the fallback if uv cannot be had.
  if [[ ! -x $VENV/bin/uv ]]; then
    echo "fetching the installer uv from PyPI"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check uv ||
      echo "could not install uv; falling back to pip (slower)"
  fi
  packages=(-e '.[operator,spark,test,kubectl]' -e ./examples)
  # pyspark is published as a source distribution only (450 MB). This machine kind's HTTPS
  # proxy serves PyPI's files without their cache headers, so uv took its cached download for
  # stale: every fresh clone downloaded it again and built it again (about a minute, and 1.4 GB
  # more of uv's cache each time). A wheel is built once per version into the cache's wheels/
  # instead (under a lock: setups may run side by side), and both installers look there first.
  wheels="${OFFTAKE_CACHE:-$HOME/.cache/offtake}/wheels"
  mkdir -p "$wheels"
  spark_requirement=$("$VENV/bin/python" -c '
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["spark"]
print(next(r for r in extra if r.startswith("pyspark")).replace("[connect]", ""))')
  flock "$wheels/.lock" "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    --find-links "$wheels" -w "$wheels" "$spark_requirement" ||
    echo "could not build a wheel of $spark_requirement into $wheels; the installer builds it"
  packages=(--find-links "$wheels" "${packages[@]}")
  if [[ -x $VENV/bin/uv ]]; then
    # Without a terminal uv prints no progress bars: its summary lines say what it fetched,
    # built and installed, and how long each took; its list of every package installed
    # (" + name==version", a hundred lines) is left out (.venv/bin/uv pip list shows them).
    "$VENV/bin/uv" pip install --python "$VENV/bin/python" "${packages[@]}" 2>&1 |
      { grep -v '^ [+-] ' || true; }
  else
    "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar on \
      "${packages[@]}"
  fi
  stamp >"$stamp_file"
fi

PY="$VENV/bin/python"
step "Apache Kafka (Maven Central jars)"
"$PY" -m offtake_testbed.kafka install >/dev/null # its progress and what it found: stderr

if [[ $MODE == --all || $MODE == --node || $MODE == --tests ]]; then
  # The test bed's parts do not depend on each other, and a bare machine spends minutes on
  # each: downloads (Maven Central, Debian, PyPI) and builds (Go, a JVM's training run). They
  # run side by side, each with its output in a log of its own that is printed when it ends,
  # so the set-up takes about as long as its longest part instead of their sum.
  parts_dir=$(mktemp -d)
  trap 'rm -rf "$parts_dir"' EXIT
  part_names=()
  part() { # part NAME TITLE COMMAND...: start COMMAND in the background
    local name=$1 title=$2
    shift 2
    part_names+=("$name")
    printf '%s\n' "$title" >"$parts_dir/$name.title"
    (
      began=$EPOCHREALTIME
      set +e
      "$@" >"$parts_dir/$name.log" 2>&1
      code=$?
      printf '%s %s\n' "$code" "$(bc_sub "$EPOCHREALTIME" "$began")" >"$parts_dir/$name.done"
    ) &
  }
  # The Spark tier: its tests start local Spark sessions, faster from the archive (once per JVM
  # and Spark version, kept in the cache). The Kafka demo starts no Spark, so it does not wait
  # for it. Spark's own log lines go to a file, named if the build fails.
  spark_archive() {
    local archive_log="${OFFTAKE_CACHE:-$HOME/.cache/offtake}/spark-archive.log" archive
    mkdir -p "$(dirname "$archive_log")"
    if archive=$("$VENV/bin/offtake" spark-archive 2>"$archive_log"); then
      echo "archive: $archive"
    else
      echo "no class-data archive (is java installed? see $archive_log): local Spark sessions" \
        "start without one"
    fi
  }
  # Both from Debian: one after the other (apt-get holds dpkg's lock).
  debian_parts() {
    "$PY" -m offtake_testbed.prometheus install && "$PY" -m offtake_testbed.postgres install
  }
  # --tests: the control plane is built by a process of its own, detached from this script
  # (setsid, no terminal, its output in the cache), so that it goes on after this script has
  # ended; the build holds the cache's lock for it, and install_control_plane() in a test's
  # fixture waits on that lock. Nothing is started when it is built already.
  kube_in_background() {
    local log
    log=$("$PY" -m offtake_testbed.kube built) && return 0
    # Started from a subshell that ends at once, so it is no child of this script: the `wait`
    # for the parts below must not wait for it.
    (setsid "$PY" -m offtake_testbed.kube install --no-helm </dev/null >"$log" 2>&1 &)
    printf '\n== kube-apiserver, etcd, kube-controller-manager, kubectl (Go module proxy)\n'
    echo "building in the background while the tests run (log: $log)"
  }
  part spark-archive "Spark class-data archive (offtake spark-archive: local Spark sessions start faster)" \
    spark_archive
  part debian "Prometheus, promtool and PostgreSQL (Debian)" debian_parts
  part apicurio "Apicurio Registry, the schema registry (built from Maven Central jars)" \
    "$PY" -m offtake_testbed.apicurio install
  if [[ $MODE == --tests ]]; then
    # helm stays in the foreground: scripts/lint.sh renders the chart with it.
    part helm "helm (Go module proxy)" "$PY" -m offtake_testbed.kube install --only-helm
    kube_in_background
  else
    part kube "kube-apiserver, etcd, kube-controller-manager, kubectl, helm (Go module proxy)" \
      "$PY" -m offtake_testbed.kube install
  fi
  part scanners "kube-score, kubeconform (Go module proxy) and checkov (PyPI), for scripts/lint.sh" \
    "$PY" -m offtake_testbed.scanners install
  step "the test bed's parts, side by side: ${part_names[*]}"
  wait
  step_done
  failed=()
  for name in "${part_names[@]}"; do
    read -r code seconds <"$parts_dir/$name.done"
    printf '\n== %s\n' "$(cat "$parts_dir/$name.title")"
    cat "$parts_dir/$name.log"
    printf '   (%.1fs)\n' "$seconds"
    if [[ $code != 0 ]]; then
      failed+=("$name")
    fi
  done
  if ((${#failed[@]})); then
    printf '\nset-up failed in: %s (their output is above)\n' "${failed[*]}" >&2
    exit 1
  fi
fi
if [[ $MODE == --node ]]; then
  step "kubelet, containerd, runc, CNI plugins, prometheus-adapter (Go module proxy)"
  "$PY" -m offtake_testbed.node install
fi
step_done
printf '\nset-up done in %.0fs; to use offtake from this shell: source %s/bin/activate\n' \
  "$(bc_sub "$EPOCHREALTIME" "$setup_started")" "$VENV"
