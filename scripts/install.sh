#!/usr/bin/env bash
# Build the release wheel and install it with its runtime (and, given
# extras such as "test", optional) dependencies. Tests and benchmarks run
# against this installed wheel, never against the source tree.
#
# The wheel is the one users get on Linux: manylinux2014 (glibc >= 2.17),
# linked with zig (the `ziglang` package from PyPI) so that it does not pick
# up this machine's newer glibc symbols. maturin itself refuses to tag the
# wheel manylinux2014 if the library needs anything newer; tests/test_wheel.py
# checks the tag again with auditwheel.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv_note.sh
extras="${1:-}"
python3 -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" "ziglang>=0.17,<0.18"
rm -rf dist
# For the interpreter that runs the tests (a wheel per CPython version).
maturin build --release --zig --compatibility manylinux2014 --interpreter "$(command -v python3)" --out dist
wheel=$(ls dist/tinker_rl_data-*.whl)
python3 -m pip install --quiet --disable-pip-version-check "${wheel}${extras:+[$extras]}"
python3 -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
echo "installed $(basename "$wheel")"
