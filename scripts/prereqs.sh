#!/usr/bin/env bash
# Check what Offtake's set-up needs before any long step, and say for each missing piece, in
# one line, what it is for and the command that installs it. Exit 1 if anything is missing.
#
#   scripts/prereqs.sh          what the demo needs: Python >= 3.11 with venv, Java 17+, Maven
#   scripts/prereqs.sh --all    also what the tests need (--tests: the same): Go >= 1.24
#                               (builds the Kubernetes test bed), and apt-get as root or with
#                               sudo if Prometheus or PostgreSQL is not installed yet
#   scripts/prereqs.sh --node   also what the real-node tier (tests/node) builds with: gcc,
#                               pkg-config and libseccomp-dev for runc (cgo + seccomp), from
#                               apt-get like Prometheus and PostgreSQL
#
# scripts/setup.sh sources this file and calls check_prereqs; run on its own, it only checks.
# Only bash builtins and the checked tools are used, so that a test can run it with a PATH that
# lacks a tool.

# Sets BOOT_PYTHON to the first interpreter found that is new enough: $PYTHON if set, else
# python3.13, python3.12, python3.11, python3.
find_python() {
  local candidate version
  BOOT_PYTHON=""
  for candidate in ${PYTHON:-python3.13 python3.12 python3.11 python3}; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    version=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
      continue
    if [[ $version =~ ^3\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 11)); then
      BOOT_PYTHON=$candidate
      BOOT_PYTHON_VERSION=$version
      return 0
    fi
    BOOT_PYTHON_FOUND="$candidate is $version"
  done
  return 1
}

# Prints "NN" (the major version) of `java -version`, or nothing.
java_major() {
  local out
  out=$(java -version 2>&1) || return 1
  # 'openjdk version "17.0.15" 2025-04-15' or, before Java 9, 'java version "1.8.0_402"'.
  if [[ $out =~ version\ \"1\.([0-9]+) ]] || [[ $out =~ version\ \"([0-9]+) ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
  fi
}

# Prints "1.NN" of `go version`, or nothing.
go_minor() {
  local out
  out=$(go version 2>/dev/null) || return 1
  [[ $out =~ go1\.([0-9]+) ]] && printf '%s' "${BASH_REMATCH[1]}"
}

check_prereqs() {
  local all=0 node=0 sudo="sudo " missing=() found=() major minor
  [[ ${1:-} == --all || ${1:-} == --tests ]] && all=1
  [[ ${1:-} == --node ]] && all=1 node=1
  ((EUID == 0)) && sudo=""

  if find_python; then
    if "$BOOT_PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
      found+=("python $BOOT_PYTHON_VERSION ($BOOT_PYTHON)")
    else
      missing+=("python's venv module (creates .venv): ${sudo}apt-get install -y python3-venv")
    fi
  else
    missing+=("python >= 3.11 (${BOOT_PYTHON_FOUND:-no python3 on PATH}): ${sudo}apt-get install -y python3.11 python3.11-venv, or set PYTHON=/path/to/python3.11")
  fi

  major=$(java_major || true)
  if [[ -z $major ]]; then
    missing+=("java 17+ (runs Kafka and Spark): ${sudo}apt-get install -y openjdk-17-jre-headless")
  elif ((major < 17)); then
    missing+=("java 17+ (runs Kafka and Spark; found java $major): ${sudo}apt-get install -y openjdk-17-jre-headless")
  else
    found+=("java $major")
  fi

  if command -v mvn >/dev/null 2>&1; then
    found+=("mvn")
  else
    missing+=("mvn (Maven 3.6+, fetches Kafka's jars from Maven Central): ${sudo}apt-get install -y maven")
  fi

  if ((all)); then
    minor=$(go_minor || true)
    if [[ -z $minor ]]; then
      missing+=("go >= 1.24 (builds the Kubernetes test bed from the Go module proxy): ${sudo}apt-get install -y golang-go, or a release from go.dev/dl")
    elif ((minor < 24)); then
      missing+=("go >= 1.24 (builds the Kubernetes test bed; found go 1.$minor): a newer release from go.dev/dl, or ${sudo}apt-get install -y golang-1.24-go")
    else
      found+=("go 1.$minor")
    fi
    local packages=()
    command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 ||
      packages+=(prometheus)
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || packages+=(postgresql)
    if ((node)); then
      command -v gcc >/dev/null 2>&1 || packages+=(gcc)
      command -v pkg-config >/dev/null 2>&1 || packages+=(pkg-config)
      [[ -e /usr/include/seccomp.h ]] || packages+=(libseccomp-dev)
    fi
    if ((${#packages[@]})); then
      if ! command -v apt-get >/dev/null 2>&1; then
        missing+=("${packages[*]} (what the tests run or build with): install them with your distribution's package manager (no apt-get here)")
      elif ((EUID != 0)) && ! sudo -n true >/dev/null 2>&1; then
        missing+=("${packages[*]} (what the tests run or build with; set-up installs them with apt-get, which needs root): sudo apt-get install -y ${packages[*]}")
      else
        found+=("apt-get for ${packages[*]}")
      fi
    else
      found+=("prometheus, postgresql")
      ((node)) && found+=("gcc, pkg-config, libseccomp-dev")
    fi
  fi

  if ((${#missing[@]})); then
    printf 'missing: %s\n' "${missing[@]}" >&2
    printf 'set-up stopped before installing anything: install the above and run it again\n' >&2
    return 1
  fi
  local line="" item
  for item in "${found[@]}"; do line+="${line:+, }$item"; done
  printf 'prerequisites found: %s\n' "$line"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  check_prereqs "$@"
fi
