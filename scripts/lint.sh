#!/usr/bin/env bash
# Static checks: ruff, mypy --strict, the import layering (import-linter) and the Dockerfiles
# (hadolint), with the tools of the project's environment .venv (scripts/setup.sh makes it).
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
"$PY" -m ruff check worker operator testbed tests bench
# Each top-level folder holds its package (worker/offtake, ...), so mypy finds them by path.
MYPYPATH=worker:operator:testbed "$PY" -m mypy --strict -p offtake -p offtake_operator -p offtake_testbed
lint-imports --config pyproject.toml
# Every Dockerfile in the repository (the images' and the examples' sidecars); an ignored rule
# is justified on the line above its `# hadolint ignore=` comment.
git ls-files -z -- Dockerfile '*/Dockerfile' | xargs -0 hadolint
