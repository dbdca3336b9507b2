#!/usr/bin/env bash
# Install into the current Python what tinker-cookbook's
# rl.data_processing, rl.train and distillation trainers import, so that the
# differential tests in tests/cookbook/ can run against the real
# cookbook. tinker-cookbook's full dependency set cannot be installed from
# the registry (tml-renderers is not there), so it is installed with
# --no-deps after the subset those modules need. Mostly torch (~5 GB);
# the CPU-only torch wheel is not on PyPI, so this is the default build.
set -euo pipefail
pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@"
}
# The tested pairs: tinker-cookbook 0.6.1 with tinker 0.38.0 (the default),
# 0.5.8 with 0.36.0 (TINKER_VERSION=0.36.0 COOKBOOK_VERSION=0.5.8).
pip_install "tinker==${TINKER_VERSION:-0.38.0}" torch chz pillow blobfile datasets termcolor
pip_install --no-deps "tinker-cookbook==${COOKBOOK_VERSION:-0.6.1}"
python3 - <<'PY'
import tinker_cookbook.rl.data_processing
import tinker_cookbook.rl.train
import tinker_cookbook.distillation.train_on_policy
import tinker_cookbook.distillation.sdft
from importlib.metadata import version
print("tinker-cookbook", version("tinker-cookbook"), "importable")
PY
