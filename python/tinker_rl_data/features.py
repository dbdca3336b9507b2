"""The package's features: their order in the report, and the registry
their declarations register into. Each feature's module ends with its
``FEATURE`` (:class:`~tinker_rl_data.patch.feature.Feature`), registered
here as the module is imported::

    FEATURE = features.register(__name__, Feature("kl", ...))

Everything else is derived from the declarations: install()'s options and
what they select (:func:`chosen`), the launcher's flags, the report's
lines, ``status()``, and the tables of pieces and switches in the docs
(:func:`piece_table`, :func:`switch_table`; tests/patch/test_features.py
keeps the docs equal to them). A new feature is a new module registering
its ``FEATURE``, its name in :data:`ORDER`, and its import in
``tinker_rl_data.cookbook``.

It imports nothing of ``tinker/`` or ``cookbook/``: their modules import
it (one way). :func:`declared` needs every feature's module imported;
``tinker_rl_data.cookbook`` imports them all (its own and tinker's), and
every entry point reading the whole list imports it first:
``cookbook.install()`` installs them all, ``tinker_rl_data.install()`` the
request bytes alone, and each report has a line for every one."""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Mapping

from . import switches
from .patch.feature import Feature, Option, selected
from .patch.report import Report

__all__ = [
    "ORDER", "chosen", "declared", "options", "piece_table", "provide_worker_counters", "register", "signature",
    "switch_table", "worker_counters",
]

#: Every feature's name, in the report's order.
ORDER = ("wire", "transport", "data", "step", "kl", "gc", "coalesce", "workers")

#: Each registered feature's name -> the module holding its ``FEATURE``.
_holders: dict[str, str] = {}


def register(module: str, feature: Feature) -> Feature:
    """``feature``, the declaration of ``module`` (its ``__name__``),
    registered; returned, for the module's ``FEATURE``. Its name must be in
    :data:`ORDER` (where its line goes), and no other module's."""
    if feature.name not in ORDER:
        raise ValueError(f"feature {feature.name!r} of {module} is not in {__name__}.ORDER: add it where its report line goes")
    holder = _holders.setdefault(feature.name, module)
    if holder != module:
        raise ValueError(f"feature {feature.name!r} is declared by both {holder} and {module}")
    return feature


# Where rollout workers' counters come from (``cookbook.workers`` provides
# them as it is imported; a status line reads them through this module).
_worker_counters: list[Callable[[], Mapping[str, float]]] = []


def provide_worker_counters(provider: Callable[[], Mapping[str, float]]) -> None:
    """``provider()``: the rollout workers' counters, summed over them."""
    _worker_counters[:] = [provider]


def worker_counters() -> Mapping[str, float]:
    """What rollout workers carried back with their results, summed over
    them (``cookbook.workers.ADDITIVE``), for a feature's status line that
    counts the whole run: empty where no rollout ran in a worker."""
    return _worker_counters[0]() if _worker_counters else {}


def declared() -> tuple[Feature, ...]:
    """Every feature's declaration, in :data:`ORDER`, as its module holds
    it now (its ``FEATURE``: a test may replace it). Raises LookupError
    naming the features whose module is not imported."""
    modules = {name: sys.modules[_holders[name]] for name in ORDER if _holders.get(name) in sys.modules}
    missing = [name for name in ORDER if name not in modules]
    if missing:
        raise LookupError(
            f"{__name__}: no declaration of {', '.join(missing)}: their modules are not imported "
            "(tinker_rl_data.cookbook imports every feature's module: import it first)"
        )
    return tuple(modules[name].FEATURE for name in ORDER)


def options() -> dict[str, Any]:
    """install()'s keywords (``strict`` aside) and their defaults: one per
    feature with a switch, then the options features read."""
    found: dict[str, Any] = {f.name: f.default for f in declared() if f.switch}
    found.update((option.name, option.default) for f in declared() for option in f.options)
    return found


def chosen(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The features install() with these keyword ``arguments`` selects."""
    unknown = sorted(set(arguments) - set(options()))
    if unknown:
        raise TypeError(f"install() got an unexpected keyword argument {unknown[0]!r}")
    return selected(declared(), arguments)


def signature() -> inspect.Signature:
    """``cookbook.install()``'s: its keyword-only options, then ``strict``."""
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value) for name, value in options().items()]
    strict = inspect.Parameter("strict", inspect.Parameter.KEYWORD_ONLY, default=None)
    return inspect.Signature([*keywords, strict], return_annotation=Report)


# --------------------------------------------------------------------------
# The docs' tables


def piece_table() -> str:
    """The pieces, one row each (module, name, feature, default)."""
    rows = ["| module | name | feature | default |", "| --- | --- | --- | --- |"]
    for feature in declared():
        default = "on" if feature.default else "off (opt-in)"
        rows.extend(f"| `{p.module}` | `{p.name}` | `{feature.name}` | {default} |" for p in feature.pieces)
    return "\n".join(rows)


def _variable_of(option: Option) -> str:
    return f", `{option.variable}={option.example}`" if option.variable else ""


def switch_table() -> str:
    """Every switch: install()'s options and the launcher's flags, then the
    environment variables (one row each, or with the option they set)."""
    rows = ["| switch | default | what it does |", "| --- | --- | --- |"]
    with_option = set()
    for feature in declared():
        if feature.switch:
            value = "False" if feature.default else "True"
            default = "on" if feature.default else "off"
            rows.append(f"| `install({feature.name}={value})`, `{feature.flag}` | {default} | {feature.description} |")
        for option in feature.options:
            with_option.add(option.variable)
            variable = switches.variable(option.variable) if option.variable else None
            default, what = (variable.default, variable.description) if variable else (repr(option.default), option.description)
            rows.append(f"| `install({option.name}={option.example})`{_variable_of(option)} | {default} | {what} |")
    strict = switches.variable(switches.STRICT)
    rows.append(f"| `install(strict=True)`, `--strict`, `{strict.name}={strict.example}` | off | {strict.description} |")
    with_option.add(switches.STRICT)
    for variable in switches.VARIABLES:
        if variable.name not in with_option:
            rows.append(f"| `{variable.name}={variable.example}` | {variable.default} | {variable.description} |")
    return "\n".join(rows)

