#!/usr/bin/env bash
# The whole test suite: Rust format and lints, the Rust unit and fuzz tests,
# then pytest against the installed release wheel, and the hostile-input
# suite again under CPython's debug allocator and in development mode (a use
# after free there crashes instead of passing by luck).
# HYPOTHESIS_PROFILE=ci runs 1000 examples per property (default "dev": 200).
# The tinker-cookbook differential tests run when tinker-cookbook is
# installed (scripts/install_cookbook.sh) and skip otherwise, unless
# TINKER_RL_DATA_REQUIRE_COOKBOOK=1 (as in CI) makes a skip a failure.
# TINKER_RL_DATA_HOSTILE_RERUNS=0 skips the two reruns of the hostile suite
# (CI runs them on two of its three CPythons). TINKER_RL_DATA_RUST_CHECKS=0
# skips the Rust format, lint and test steps (the same on every CPython: CI
# runs them once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
if [[ ${TINKER_RL_DATA_RUST_CHECKS:-1} == 1 ]]; then
    cargo fmt --check
    cargo clippy --release --all-targets --quiet -- -D warnings
    cargo test --release
fi
python3 -m pytest -q -p no:cacheprovider tests
if [[ ${TINKER_RL_DATA_HOSTILE_RERUNS:-1} == 1 ]]; then
    PYTHONMALLOC=debug python3 -m pytest -q -p no:cacheprovider tests/test_hostile.py
    python3 -X dev -m pytest -q -p no:cacheprovider tests/test_hostile.py
fi
