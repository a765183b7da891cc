"""Copy the CRD of crds/ to the places that ship it: the Helm chart and the worker's package.

    python crds/generate.py          # rewrite the copies
    python crds/generate.py --check  # exit 1 if a copy is out of date (scripts/lint.sh)

crds/consumerpipeline.yaml is the one schema: the API server enforces it, and the worker's
loader reads its defaults, bounds and choices from the package's copy (offtake.config.crd_check).
Copies rather than links: Helm packages only files inside the chart, and a link into the
package breaks with git's core.symlinks=false and in a wheel built from an sdist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "crds" / "consumerpipeline.yaml"
COPIES = (
    ROOT / "helm" / "offtake" / "crds" / "consumerpipeline.yaml",
    ROOT / "worker" / "offtake" / "config" / "consumerpipeline.yaml",
)
HEADER = "# Generated from crds/consumerpipeline.yaml by crds/generate.py: edit that one.\n"


def expected() -> str:
    return HEADER + SOURCE.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a copy is out of date")
    args = parser.parse_args(argv)
    text = expected()
    stale = [p for p in COPIES if p.is_symlink() or not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is out of date: run python crds/generate.py")
        return 1 if stale else 0
    for p in stale:
        p.unlink(missing_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
