"""Old import paths that still work for one release: a module left at the old path forwards every name to the new
home and warns, naming it, each time a name is taken from the old path."""
import importlib
import warnings
from collections.abc import Callable
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
