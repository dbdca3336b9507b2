"""What an install did, or (:func:`tinker_rl_data.status`) what is in effect:
:class:`Report`. ``print(report)`` is one line per feature;
``print(report.details())`` adds every site replaced and every reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..switches import FEATURES

__all__ = ["DISTRIBUTIONS", "TESTED_VERSIONS", "Report"]

#: The versions the test suite runs against, per package.
TESTED_VERSIONS = {"tinker": ("0.36.0", "0.38.0"), "tinker_cookbook": ("0.5.8", "0.6.1")}

DISTRIBUTIONS = {"tinker": "tinker", "tinker_cookbook": "tinker-cookbook"}


@dataclass
class Report:
    """What an install did (or, from :func:`tinker_rl_data.status`, what is in effect).

    ``installed``: (piece, sites replaced); ``left``: (piece, why it stays
    out); ``older``: the pieces of ``left`` that the installed (older)
    release does not have or that ours does not reproduce there (no cause
    for a warning); ``kept``: other modules' names holding a user's or another
    library's function, left alone; ``features``: each piece's feature;
    ``not_asked``: features not selected; ``skipped``: features or pieces
    turned off by ``TINKER_RL_DATA_SKIP``; ``construction``: how Datums are
    built (``direct`` or why tinker's constructors are used); ``merged``:
    coalesced sampling's counts; ``workers``: one line per rollout worker
    seen (what it installed, its rollouts); ``probe_ms``: the probes' time.
    """

    installed: list[tuple[str, list[str]]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    older: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    features: dict[str, str] = field(default_factory=dict)
    not_asked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    construction: str = ""
    int_read: str = ""
    probe_ms: float = 0.0
    probe_times: dict[str, float] = field(default_factory=dict)
    disabled: bool = False
    merged: dict[str, int] = field(default_factory=dict)
    workers: list[str] = field(default_factory=list)

    @property
    def fast_construction(self) -> bool | None:
        """Whether Datums are built directly (None: tinker not imported)."""
        return None if not self.construction else self.construction == "direct"

    def _header(self) -> str:
        from .. import __version__

        def version(package: str) -> str:
            found = self.versions.get(package)
            if found is None:
                return f"{DISTRIBUTIONS[package]} not installed"
            tested = "tested" if found in TESTED_VERSIONS[package] else "untested version"
            return f"{DISTRIBUTIONS[package]} {found} ({tested})"

        parts = [f"tinker_rl_data {__version__}", ", ".join(version(p) for p in TESTED_VERSIONS)]
        if self.probe_ms:
            parts.append(f"probes {self.probe_ms:.0f} ms")
        return " | ".join(parts)

    def __str__(self) -> str:
        lines = [self._header()]
        if self.disabled:
            lines.append("  disabled by TINKER_RL_DATA_DISABLE=1: nothing installed")
            return "\n".join(lines)
        installed = {title for title, _ in self.installed}
        left = dict(self.left)
        for feature, what in FEATURES.items():
            titles = [t for t, f in self.features.items() if f == feature]
            if feature in self.not_asked:
                state = "opt-in, not asked" if feature == "coalesce" else "off (not asked)"
                lines.append(f"  {feature:<9} {state:<22} {what}")
                continue
            if feature in self.skipped:
                lines.append(f"  {feature:<9} {'off (TINKER_RL_DATA_SKIP)':<22} {what}")
                continue
            if not titles:
                continue
            older = [t for t in titles if t in self.older]
            titles = [t for t in titles if t not in self.older]
            n_in = sum(t in installed for t in titles)
            if not titles:
                lines.append(f"  {feature:<9} {'not for this version':<22} {what}: {left[older[0]]}")
                continue
            state = "on" if n_in == len(titles) else "off" if n_in == 0 else "partly on"
            note = f" ({len(older)} not for this version)" if older else ""
            lines.append(f"  {feature:<9} {f'{state}, {n_in} of {len(titles)}':<22} {what}{note}")
            for title in titles:
                if title in left:
                    lines.append(f"      {title}: {left[title]}")
        for title, why in self.left:
            if title not in self.features:  # a whole package missing
                lines.append(f"  {title}: {why}")
        if self.skipped:
            pieces = [s for s in self.skipped if s not in FEATURES]
            if pieces:
                lines.append("  skipped by TINKER_RL_DATA_SKIP: " + ", ".join(pieces))
        if self.construction:
            lines.append(f"  Datum construction: {self.construction}; int read: {self.int_read}")
        if self.merged:
            lines.append(
                f"  coalesced sampling: {self.merged.get('merged_calls', 0)} calls sent as "
                f"{self.merged.get('merged_requests', 0)} requests"
            )
        lines.extend(f"  worker {line}" for line in self.workers)
        return "\n".join(lines)

    def details(self) -> str:
        """Every site replaced, every piece left and why, every name kept, each probe's time."""
        lines = [self._header()]
        for title, sites in self.installed:
            ms = self.probe_times.get(title)
            lines.append(f"  in    {title}" + (f" ({ms:.0f} ms)" if ms is not None else ""))
            lines.extend(f"          {site}" for site in sites)
        for title, why in self.left:
            lines.append(f"  out   {title}: {why}")
        lines.extend(f"  kept  {name} (holds another function)" for name in self.kept)
        return "\n".join(lines)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"Report({fields})"
