#!/usr/bin/env bash
# The whole test suite: Rust format and lints, the Rust unit tests, then
# pytest against the installed release wheel. HYPOTHESIS_PROFILE=ci runs
# 1000 examples per property (the default "dev" profile runs 200).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
cargo fmt --check
cargo clippy --release --all-targets --quiet -- -D warnings
cargo test --release
python3 -m pytest -q -p no:cacheprovider tests
