#!/usr/bin/env bash
# Build and install the wheel, then run the whole pipeline on a synthetic
# batch and time it against the plain-Python reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 bench/demo.py "$@"
