#!/usr/bin/env bash
# Build and install the wheel, then run the whole pipeline on a synthetic
# batch and time it against the module it replaces (and tinker-cookbook,
# when installed). Run it inside a virtual environment:
#   python3 -m venv .venv && . .venv/bin/activate && bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# A bad workload name is reported before the (minutes long) build.
python3 bench/demo.py --check "$@"
if [[ -z "${CONDA_PREFIX:-}" ]] && ! python3 -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'; then
    cat >&2 <<'EOF'
scripts/demo.sh: not inside a virtual environment.
It installs the package and its dependencies with pip; outside a virtual
environment that either fails (Debian/Ubuntu: "externally-managed-environment")
or installs into your system Python. Make one and run again:

    python3 -m venv .venv && . .venv/bin/activate
    bash scripts/demo.sh

(To install into this interpreter anyway: TINKER_RL_DATA_NO_VENV=1 bash scripts/demo.sh)
EOF
    if [[ "${TINKER_RL_DATA_NO_VENV:-}" != 1 ]]; then
        exit 1
    fi
    echo "TINKER_RL_DATA_NO_VENV=1: installing into $(python3 -c 'import sys; print(sys.prefix)')" >&2
fi
bash scripts/install.sh
python3 bench/demo.py "$@"
