"""The package's features, in the report's order: the one list of them.
Everything else is derived from their declarations (each module's
``FEATURE``, :class:`~tinker_rl_data.patch.feature.Feature`): install()'s
options and what they select (:func:`chosen`), the launcher's flags, the
report's lines, ``status()``, and the tables of pieces and switches in the
docs (:func:`piece_table`, :func:`switch_table`; tests/patch/test_features.py
keeps the docs equal to them). A new feature is a new module ending with
its ``FEATURE``, and its entry in :func:`modules` (with its import) here.

It sits at the package's level, above ``tinker/`` and ``cookbook/`` whose
modules it lists: ``cookbook.install()`` installs them all,
``tinker_rl_data.install()`` the request bytes alone, and each report has a
line for every one."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Mapping

from . import switches
from .patch.feature import Feature, Option, selected
from .patch.report import Report

__all__ = ["chosen", "declared", "modules", "options", "piece_table", "signature", "switch_table"]


def modules() -> tuple[ModuleType, ...]:
    """Each feature's module, in the report's order. Imported when first
    asked, not with this module: ``cookbook``, whose ``install()`` reads the
    list, imports it last, to set that function's signature (:func:`signature`)."""
    from .cookbook import data_processing, gc_step, kl, step, workers
    from .tinker import coalesce, request_bytes, transport

    return (request_bytes, transport, data_processing, step, kl, gc_step, coalesce, workers)


def declared() -> tuple[Feature, ...]:
    """Every feature's declaration, as its module holds it now."""
    return tuple(module.FEATURE for module in modules())


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

