#!/usr/bin/env bash
# Static checks: ruff, mypy --strict, and the import layering (import-linter).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m ruff check worker operator testbed tests bench
# mypy resolves packages by folder name; ours are mapped (worker/ -> offtake), so give it a
# tree of links with the import names. Nothing is copied and nothing lands in the repo.
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
ln -s "$PWD/worker" "$ROOT/offtake"
ln -s "$PWD/operator" "$ROOT/offtake_operator"
ln -s "$PWD/testbed" "$ROOT/offtake_testbed"
MYPYPATH="$ROOT" "$PY" -m mypy --strict -p offtake -p offtake_operator -p offtake_testbed
(cd "$ROOT" && PYTHONPATH="$ROOT" lint-imports --config "$OLDPWD/pyproject.toml")
