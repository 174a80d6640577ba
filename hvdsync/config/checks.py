"""The checks every config field goes through, and the one error type they raise.

Each check names the dotted field and what is allowed (``sync.period: 0 is not allowed; expected an integer >= 1``),
so one message tells the user what to change. Kept apart from the sections so that a new section or adapter can
reuse the same wording.
"""
from __future__ import annotations

import math
from typing import Any


FRAMEWORKS = ("torch", "tensorflow")
REDUCE_OPS = ("average", "sum", "adasum")
OPTIMIZERS = ("sgd", "adam")
LR_SCALING = ("none", "linear")
PRECISIONS = ("fp32", "fp16", "bf16")


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted field name."""


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{name}: {value!r} is not allowed; {allowed}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(name, value, "choose one of: " + ", ".join(choices))


def _int(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        rng = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        _fail(name, value, f"expected {rng}")


def _number(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value < high)
    if not ok:
        lo = f"> {low}" if low_open else f">= {low}"
        hi = "" if high is None else f" and < {high}"
        _fail(name, value, f"expected a number {lo}{hi}")


def _registered(registry: Any, name: str, value: Any, framework: str | None = None) -> None:
    """``value`` must be a name in ``registry`` (:mod:`hvdsync.registry`), for ``framework`` where models are."""
    from hvdsync.registry import RegistryError

    if not isinstance(value, str):
        _fail(name, value, "expected a registered name")
    try:
        registry.check(value, framework)
    except RegistryError as exc:
        raise ConfigError(str(exc)) from None


def _import_plugins(name: str, modules: Any) -> None:
    """Import the user's modules that register models or data sets (in the launcher and again in every worker)."""
    import importlib

    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        _fail(name, modules, "expected a list of importable module names, e.g. [mypackage.models]")
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            _fail(name, module, f"it cannot be imported ({exc})")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(name, value, "expected true or false")
