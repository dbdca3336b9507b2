"""What an install did, or (:func:`tinker_rl_data.status`) what is in effect:
:class:`Report`. ``print(report)`` is one line per feature;
``print(report.details())`` adds every site replaced and every reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .._core import __version__

__all__ = ["DISTRIBUTIONS", "TESTED_VERSIONS", "Entry", "Report"]

#: The versions the test suite runs against, per package.
TESTED_VERSIONS = {"tinker": ("0.36.0", "0.38.0"), "tinker_cookbook": ("0.5.8", "0.6.1")}

DISTRIBUTIONS = {"tinker": "tinker", "tinker_cookbook": "tinker-cookbook"}

#: An :class:`Entry`'s states: installed, left with a warning, and left for
#: no cause to warn (skipped; or the installed release does not have the
#: name, or already does what ours would, or ours reproduces a later one).
IN, OUT, SKIPPED, NOT_FOR_VERSION = "in", "out", "skipped", "not for this version"


@dataclass
class Entry:
    """One piece in a report (or, ``feature`` empty, a whole package left out)."""

    title: str
    feature: str
    state: str = IN
    sites: list[str] = field(default_factory=list)
    why: str = ""
    probe_ms: float | None = None
    #: Why an installed piece hands each call to the original now (a flag
    #: the service sent, known once a client fetched it); empty: it works.
    aside: str = ""


@dataclass
class Report:
    """What an install did (or, from :func:`tinker_rl_data.status`, what is in effect).

    ``entries``: per piece, keyed by ``module.name`` (:class:`Entry`), in
    install order; ``installed``, ``left`` and ``standing_aside`` are read
    from them: (title, sites replaced), (title, why it stays out) and
    (title, why an installed piece hands its calls to the original now). ``kept``: other modules'
    names holding a user's or another library's function, left alone;
    ``features``: (name, description) of each feature, in the report's
    order; ``not_asked``: each feature not selected, and how to say so;
    ``skipped``: features or pieces turned off by ``TINKER_RL_DATA_SKIP``;
    ``construction``: how Datums are built (``direct`` or why tinker's
    constructors are used); ``notes``: lines the installed features add
    (coalesced sampling's counts, the rollout workers seen);
    ``probe_ms``: the probes' time.
    """

    entries: dict[str, Entry] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    features: list[tuple[str, str]] = field(default_factory=list)
    not_asked: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    construction: str = ""
    int_read: str = ""
    probe_ms: float = 0.0
    disabled: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def installed(self) -> list[tuple[str, list[str]]]:
        """(piece, sites replaced) of each piece installed."""
        return [(e.title, e.sites) for e in self.entries.values() if e.state == IN]

    @property
    def standing_aside(self) -> list[tuple[str, str]]:
        """(piece, why) of each installed piece that hands its calls to the
        original now (:attr:`Entry.aside`)."""
        return [(e.title, e.aside) for e in self.entries.values() if e.state == IN and e.aside]

    @property
    def left(self) -> list[tuple[str, str]]:
        """(piece, why it stays out) of each piece left out."""
        return [(e.title, e.why) for e in self.entries.values() if e.state != IN]

    @property
    def fast_construction(self) -> bool | None:
        """Whether Datums are built directly (None: tinker not imported)."""
        return None if not self.construction else self.construction == "direct"

    def _header(self) -> str:
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
        for feature, what in self.features:
            if feature in self.not_asked:
                lines.append(f"  {feature:<9} {self.not_asked[feature]:<22} {what}")
                continue
            if feature in self.skipped:
                lines.append(f"  {feature:<9} {'off (TINKER_RL_DATA_SKIP)':<22} {what}")
                continue
            entries = [e for e in self.entries.values() if e.feature == feature]
            if not entries:
                continue
            older = [e for e in entries if e.state == NOT_FOR_VERSION]
            counted = [e for e in entries if e.state != NOT_FOR_VERSION]
            n_in = sum(e.state == IN and not e.aside for e in counted)  # a piece standing aside is not on
            if not counted:
                lines.append(f"  {feature:<9} {'not for this version':<22} {what}: {older[0].why}")
                continue
            state = "on" if n_in == len(counted) else "off" if n_in == 0 else "partly on"
            note = f" ({len(older)} not for this version)" if older else ""
            lines.append(f"  {feature:<9} {f'{state}, {n_in} of {len(counted)}':<22} {what}{note}")
            lines.extend(f"      {e.title}: {e.why}" for e in counted if e.state != IN)
            lines.extend(f"      {e.title}: stands aside: {e.aside}" for e in counted if e.state == IN and e.aside)
        lines.extend(f"  {e.title}: {e.why}" for e in self.entries.values() if not e.feature)  # a whole package missing
        names = {feature for feature, _ in self.features}
        pieces = [s for s in self.skipped if s not in names]
        if pieces:
            lines.append("  skipped by TINKER_RL_DATA_SKIP: " + ", ".join(pieces))
        if self.construction:
            lines.append(f"  Datum construction: {self.construction}; int read: {self.int_read}")
        lines.extend(f"  {note}" for note in self.notes)
        return "\n".join(lines)

    def details(self) -> str:
        """Every site replaced, every piece left and why, every name kept, each probe's time."""
        lines = [self._header()]
        for e in self.entries.values():
            if e.state == IN:
                lines.append(f"  in    {e.title}" + (f" ({e.probe_ms:.0f} ms)" if e.probe_ms is not None else ""))
                if e.aside:
                    lines.append(f"          stands aside: {e.aside}")
                lines.extend(f"          {site}" for site in e.sites)
        lines.extend(f"  out   {title}: {why}" for title, why in self.left)
        lines.extend(f"  kept  {name} (holds another function)" for name in self.kept)
        return "\n".join(lines)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"Report({fields})"
