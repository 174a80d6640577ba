"""Names that left a launcher module for one below it (issue 50's launcher template): the old path still imports them
for one release, with a ``DeprecationWarning`` naming the new one."""
from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

UNTIL = "0.4.0"


def moved(old: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``old``: each name in ``homes`` comes from its new module, with a warning."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        new = homes[name]
        # stacklevel 2: the warning points at the user's import line.
        warnings.warn(f"{old}.{name} moved to {new}.{name} in hvdsync 0.3.0: import it from {new} (the old path "
                      f"goes in {UNTIL})", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
