# Sourced by the scripts: says so, clearly, when they would install into an
# interpreter outside a virtual environment (README: make one first).
if ! python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    cat >&2 <<'NOTE'
note: no virtual environment is active, so packages go into this Python's own
      site-packages. To keep them apart (and on Debian/Ubuntu system Pythons,
      which refuse pip installs), first run:
          python3 -m venv .venv && . .venv/bin/activate
NOTE
fi
