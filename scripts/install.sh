#!/usr/bin/env bash
# Build the release wheel and install it with its runtime (and, given
# extras such as "test", optional) dependencies. Tests and benchmarks run
# against this installed wheel, never against the source tree.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2"
rm -rf dist
maturin build --release --out dist
wheel=$(ls dist/tinker_rl_data-*.whl)
python3 -m pip install --quiet --disable-pip-version-check "${wheel}${extras:+[$extras]}"
python3 -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
echo "installed $(basename "$wheel")"
