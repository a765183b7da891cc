#!/usr/bin/env bash
# Static checks: ruff, mypy --strict, the import layering (import-linter), the Dockerfiles
# (hadolint) and the manifests Offtake puts in a cluster (kubeconform, kube-score, checkov on the
# chart and the operator's children of examples/), with the tools of the project's environment
# .venv (scripts/setup.sh makes it) and the scanners scripts/setup.sh --all puts in the cache.
# Without a .venv it falls back to the tools on PATH, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OFFTAKE_VENV:-.venv}
if [[ -x $VENV/bin/python ]]; then
  export PATH="$PWD/$VENV/bin:$PATH"
else
  echo "lint: no $VENV (run scripts/setup.sh); using the tools on PATH" >&2
fi
PY=${PYTHON:-python}
command -v "$PY" >/dev/null || PY=python3
"$PY" -m ruff check worker operator testbed tests bench crds scripts/check_sizes.py
# The size rules (no function over 80 lines, no module over 600), with the shrinking allowlist
# of the files that broke them when the rule came (scripts/size_allowlist.txt).
"$PY" scripts/check_sizes.py worker operator
# Each top-level folder holds its package (worker/offtake, ...), so mypy finds them by path.
MYPYPATH=worker:operator:testbed "$PY" -m mypy --strict -p offtake -p offtake_operator -p offtake_testbed
lint-imports --config pyproject.toml
# The CRD's copies in the chart and the worker's package are generated from crds/.
"$PY" crds/generate.py --check
# Every Dockerfile in the repository (the images' and the examples' sidecars); an ignored rule
# is justified on the line above its `# hadolint ignore=` comment.
git ls-files -z -- Dockerfile '*/Dockerfile' | xargs -0 hadolint
# The chart (helm template) and every child the operator renders for examples/: kubeconform
# against the Kubernetes release's own schemas, kube-score and checkov, whose deliberate
# exceptions are listed with their reasons in scripts/scan/. The scanners and helm come from
# `scripts/setup.sh --all` (built once from the Go module proxy and PyPI into the cache).
PYTHONPATH="$PWD/worker:$PWD/operator:$PWD/testbed${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" -m offtake_testbed.manifest_scan
