"""Typing: the hand-written stub matches the native module (mypy.stubtest,
as pydantic-core checks its own), and the package's annotations hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_core_stub_matches_the_native_module():
    pytest.importorskip("mypy")
    config = Path(__file__).resolve().parent.parent / "pyproject.toml"  # torch and transformers not followed
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--mypy-config-file", str(config), "tinker_rl_data._core"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_type_checks():
    # It ships py.typed: its own annotations must hold.
    pytest.importorskip("mypy")
    result = subprocess.run([sys.executable, "-m", "mypy", "-p", "tinker_rl_data"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
