"""Old import paths that still work for one release: a module left at the old path forwards every name to the new
home and warns, naming it, each time a name is taken from the old path."""
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def forward(old: str, new: str, until: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of a module that moved from ``old`` to ``new``; the old path goes in ``until``."""

    def __getattr__(name: str) -> Any:
        # Dunder look-ups (copy, pickle, inspect probing the module) are not a user's import: no warning for those.
        if name.startswith("__") and name != "__all__":
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        # stacklevel 2: the warning points at the user's import line, so Python's default filter shows it there.
        warnings.warn(f"{old} moved to {new} in hvdsync 0.2.0: import {name} from {new} "
                      f"(the old path goes in {until})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__


def to_adapters(old: str, homes: Mapping[str, str], until: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of a core path whose names are public in the adapters now (``hvdsync.torch.X``,
    ``hvdsync.tensorflow.X``, the same objects): ``homes`` maps each name to the core module that defines it, which
    hvdsync itself imports, so that only a user's import of the old path warns."""

    def __getattr__(name: str) -> Any:
        if name not in homes:  # dunder probes included: nothing else was ever taken from this path
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(f"{old}.{name} is public as hvdsync.torch.{name} and hvdsync.tensorflow.{name}: import "
                      f"{name} from your adapter (the old path goes in {until})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(homes[name]), name)

    return __getattr__
