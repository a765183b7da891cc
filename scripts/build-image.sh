#!/usr/bin/env bash
# Build Offtake's images from the Dockerfile without a Docker engine: buildah (Debian's package)
# with the vfs storage driver and chroot isolation, as root. The base is pinned by digest like
# any build of the Dockerfile:
#
#   scripts/build-image.sh [--target T ...] [--base IMAGE@sha256:DIGEST] [--oci-dir DIR]
#
#   --target T     operator, worker or worker-spark (repeatable; default: operator worker)
#   --base REF     a base image pinned by digest, pulled from its registry (e.g. the official
#                  python:3.11-slim-bookworm@sha256:...); default: a Debian bookworm base built
#                  here from Debian's packages with mmdebstrap (python3, python3-venv), pinned by
#                  the digest buildah gives it
#   --oci-dir DIR  also write each image as an OCI image layout to DIR/<image name>
#
# Images are tagged localhost/offtake-<target>:<version> in buildah's storage under
# $OFFTAKE_CACHE/containers (default ~/.cache/offtake/containers), outside the repository; list
# them with  buildah --root ~/.cache/offtake/containers/storage --storage-driver vfs images.
# The first run installs buildah and mmdebstrap (apt-get) and builds the base (about 90 s); the
# operator and worker targets take about a minute each after that, worker-spark several.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
base=""
oci_dir=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --target) targets+=("$2"); shift 2 ;;
    --base) base=$2; shift 2 ;;
    --oci-dir) oci_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(operator worker)
for t in "${targets[@]}"; do
  case $t in
    operator|worker|worker-spark) ;;
    *) echo "build-image: --target $t: expected operator, worker or worker-spark" >&2; exit 2 ;;
  esac
done

cache=${OFFTAKE_CACHE:-$HOME/.cache/offtake}
work=$cache/image
mkdir -p "$work"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)

# -- tools ----------------------------------------------------------------------------------
if [[ $(id -u) -ne 0 ]]; then
  # Rootless buildah needs subordinate uid ranges and a user namespace set up for this user;
  # root with chroot isolation needs neither, and is what this machine and CI have.
  echo "build-image: run as root (buildah's chroot isolation and mmdebstrap's root mode)" >&2
  exit 1
fi
missing=()
command -v buildah >/dev/null || missing+=(buildah)
if [[ -z $base ]]; then command -v mmdebstrap >/dev/null || missing+=(mmdebstrap); fi
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "== installing ${missing[*]} (Debian)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# vfs: no overlay mounts (no fuse-overlayfs, works in any container); chroot isolation: crun
# cannot start containers on this kind of machine ("cgroups in hybrid mode not supported").
bah=(buildah --root "$cache/containers/storage" --runroot "$cache/containers/run"
  --storage-driver vfs)

# -- the base -------------------------------------------------------------------------------
if [[ -n $base ]]; then
  if [[ $base != *@sha256:* ]]; then
    echo "build-image: --base $base: pin it by digest (IMAGE@sha256:...)" >&2
    exit 2
  fi
  base_image=${base%@*}
  base_digest=${base#*@}
else
  base_image=localhost/offtake-base
  if ! "${bah[@]}" inspect --type image "$base_image:bookworm" >/dev/null 2>&1; then
    echo "== base: Debian bookworm minbase + python3 (mmdebstrap)"
    rm -f "$work/base-bookworm.tar"
    mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
      --aptopt='Acquire::Languages "none"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      bookworm "$work/base-bookworm.tar" \
      "deb http://deb.debian.org/debian bookworm main" \
      "deb http://deb.debian.org/debian bookworm-updates main" \
      "deb http://deb.debian.org/debian-security bookworm-security main"
    ctr=$("${bah[@]}" from scratch)
    "${bah[@]}" add "$ctr" "$work/base-bookworm.tar" / >/dev/null
    "${bah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --env LANG=C.UTF-8 --cmd /bin/bash \
      --created-by "mmdebstrap --variant=minbase bookworm + python3 python3-venv" "$ctr"
    "${bah[@]}" commit --quiet --rm "$ctr" "$base_image:bookworm" >/dev/null
    rm -f "$work/base-bookworm.tar"
  fi
  base_digest=$("${bah[@]}" images --format '{{.Digest}}' "$base_image:bookworm" | head -1)
fi
echo "== base $base_image@$base_digest"

# -- the targets ----------------------------------------------------------------------------
# Where HTTPS goes through an intercepting proxy (as on this project's machines), pip inside
# the build needs the host's CA bundle: it is bind-mounted into RUN steps only, never stored.
mounts=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$work/pip.conf"
  mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
    -v "$work/pip.conf:/etc/pip.conf:ro")
fi
for t in "${targets[@]}"; do
  name=localhost/offtake-$t:$version
  echo "== $name (--target $t)"
  started=$SECONDS
  "${bah[@]}" build --isolation chroot --target "$t" "${mounts[@]}" \
    --build-arg BASE_IMAGE="$base_image" --build-arg BASE_DIGEST="$base_digest" \
    --tag "$name" .
  echo "   built in $((SECONDS - started))s"
  if [[ -n $oci_dir ]]; then
    mkdir -p "$oci_dir"
    rm -rf "${oci_dir:?}/offtake-$t"
    "${bah[@]}" push --quiet "$name" "oci:$oci_dir/offtake-$t:$version"
    echo "   OCI layout: $oci_dir/offtake-$t"
  fi
done
# Intermediate stages' images are full copies under vfs: drop the untagged ones.
"${bah[@]}" rmi --prune >/dev/null 2>&1 || true
