#!/usr/bin/env bash
# The krew package of `kubectl offtake`: dist/kubectl-offtake.tar.gz (the shim
# plugins/kubectl-offtake) and dist/offtake.yaml (plugins/offtake.yaml with the archive's
# sha256). Install it locally with:
#   kubectl krew install --manifest=dist/offtake.yaml --archive=dist/kubectl-offtake.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
mkdir -p "$out"
# Fixed owner, mode and time: the same shim gives the same archive, so the same sha256.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=0755 \
  -C plugins -cf - kubectl-offtake | gzip -n >"$out/kubectl-offtake.tar.gz"
sum=$(sha256sum "$out/kubectl-offtake.tar.gz" | cut -d' ' -f1)
sed "s/sha256: \"0\{64\}\"/sha256: \"$sum\"/" plugins/offtake.yaml >"$out/offtake.yaml"
grep -q "$sum" "$out/offtake.yaml" || { echo "krew-package: no sha256 line in plugins/offtake.yaml" >&2; exit 1; }
echo "$out/kubectl-offtake.tar.gz sha256 $sum"
echo "$out/offtake.yaml"
