"""The installed wheel is the manylinux2014 one (issue 12): it installs on any
Linux with glibc >= 2.17. Its own tags, and auditwheel's reading of the
symbols its library needs, must allow nothing newer than manylinux_2_17.

The wheel file checked is the one the installed package came from: a wheel
named by $TINKER_RL_DATA_WHEEL, the file pip recorded in direct_url.json, or
one in dist/ beside tests/, whichever holds a compiled library byte-identical
to the installed one."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="manylinux tags exist only on Linux"
)

DIST_NAME = "tinker-rl-data"
MAX_GLIBC = (2, 17)
REPO = Path(__file__).resolve().parent.parent

# PEP 600 names the legacy manylinux tags by the glibc they stand for.
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def glibc_of_platform_tag(tag: str) -> tuple[int, int]:
    """The glibc a manylinux platform tag requires; ValueError for any other
    platform tag (a plain linux_x86_64 wheel installs nowhere else)."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", tag)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_\w+", tag)
    if m:
        return LEGACY[m.group(1)]
    raise ValueError(f"not a manylinux platform tag: {tag}")


def platform_tags_of_wheel_name(filename: str) -> list[str]:
    # {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl; dotted tags
    # are compressed tag sets.
    return filename.removesuffix(".whl").split("-")[-1].split(".")


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def installed_library() -> tuple[str, str]:
    """(path inside the wheel, RECORD-style hash of the installed file) of the
    compiled extension."""
    dist = metadata.distribution(DIST_NAME)
    libs = [
        f for f in dist.files or [] if re.fullmatch(r"tinker_rl_data/_core\..*(so|pyd)", str(f))
    ]
    assert len(libs) == 1, f"expected one compiled _core library, installed files list {libs}"
    path = libs[0]
    return str(path), record_hash(Path(str(path.locate())).read_bytes())


def candidate_wheels() -> list[Path]:
    found: list[Path] = []
    if os.environ.get("TINKER_RL_DATA_WHEEL"):
        found.append(Path(os.environ["TINKER_RL_DATA_WHEEL"]))
    direct_url = metadata.distribution(DIST_NAME).read_text("direct_url.json")
    if direct_url:
        url = json.loads(direct_url).get("url", "")
        if url.startswith("file:"):
            found.append(Path(unquote(urlparse(url).path)))
    found.extend(sorted((REPO / "dist").glob("tinker_rl_data-*.whl")))
    return [p for p in found if p.suffix == ".whl" and p.is_file()]


@pytest.fixture(scope="module")
def wheel() -> Path:
    lib_path, lib_hash = installed_library()
    candidates = candidate_wheels()
    for candidate in candidates:
        with zipfile.ZipFile(candidate) as zf:
            if lib_path in zf.namelist() and record_hash(zf.read(lib_path)) == lib_hash:
                return candidate
    pytest.fail(
        f"no wheel file holds the installed {lib_path} (looked at {[str(c) for c in candidates]});"
        " build and install it with scripts/install.sh, or name it in $TINKER_RL_DATA_WHEEL"
    )


def test_platform_tag_parser():
    assert glibc_of_platform_tag("manylinux2014_x86_64") == (2, 17)
    assert glibc_of_platform_tag("manylinux_2_17_aarch64") == (2, 17)
    assert glibc_of_platform_tag("manylinux_2_34_x86_64") == (2, 34)
    assert glibc_of_platform_tag("manylinux1_x86_64") == (2, 5)
    with pytest.raises(ValueError):
        glibc_of_platform_tag("linux_x86_64")
    with pytest.raises(ValueError):
        glibc_of_platform_tag("musllinux_1_2_x86_64")
    assert platform_tags_of_wheel_name(
        "tinker_rl_data-0.2.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    ) == ["manylinux2014_x86_64", "manylinux_2_17_x86_64"]


def test_installed_tags_need_at_most_glibc_2_17():
    wheel_meta = metadata.distribution(DIST_NAME).read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    assert tags, f"no Tag lines in the installed WHEEL file:\n{wheel_meta}"
    for tag in tags:
        python, abi, platform = tag.split("-")
        # Built for this interpreter (not abi3: rust/py/read/exact.rs).
        this = f"cp{sys.version_info.major}{sys.version_info.minor}"
        assert (python, abi) == (this, this), tag
        assert glibc_of_platform_tag(platform) <= MAX_GLIBC, tag


def test_wheel_file_name_tags_need_at_most_glibc_2_17(wheel):
    for platform in platform_tags_of_wheel_name(wheel.name):
        assert glibc_of_platform_tag(platform) <= MAX_GLIBC, wheel.name


def test_auditwheel_show(wheel):
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr + shown.stdout
    report = json.loads(shown.stdout)
    assert report["version"] == 1, "auditwheel's JSON report changed its schema"
    assert not report["pure"]
    # The tag auditwheel finds the library consistent with, and the one its
    # symbol versions alone allow.
    for key in ("overall_tag", "sym_tag"):
        assert glibc_of_platform_tag(report[key]) <= MAX_GLIBC, (key, report[key])
    # The glibc symbol versions themselves, read independently of the tags.
    versions = [
        tuple(int(x) for x in m.group(1).split("."))
        for symbols in report["versioned_symbols"].values()
        for v in symbols
        if (m := re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", v))
    ]
    assert versions, report
    assert max(versions) <= MAX_GLIBC, report["versioned_symbols"]
    # Nothing outside the manylinux whitelist (that would need bundling).
    assert report["external_libs"] == {}, report["external_libs"]
