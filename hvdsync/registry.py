"""Models, data sets and callbacks looked up by name, so the config, the CLI and both adapters find them without ``if`` chains.

A **model** is registered per framework: a builder ``build(cfg, data) -> model`` where ``data`` is the
:class:`hvdsync.core.train.data.Dataset` it will train on (its ``input_shape`` and ``n_classes`` size the model). A **data
set** is framework-free: ``load(data_cfg, seed) -> Dataset`` (numpy arrays; the shard plan decides who reads what).

hvdsync's own entries are declared below as ``"module:function"`` strings, imported on first use: validating a
config (in the launcher, before any worker starts) must not import torch or TensorFlow. A user registers theirs with
the decorators, in a module the workers import (a training script, or a module named in ``train.plugins``)::

    from hvdsync.registry import register_model

    @register_model("mycnn", framework="torch")
    def build_mycnn(cfg, data):
        return MyCNN(data.input_shape, data.n_classes)

    # then: hvdsync train --set train.plugins=[mypackage.models] --set train.model=mycnn
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


class RegistryError(ValueError):
    """A name is not registered (the message names the config field and what is registered)."""


class Registry:
    """Named entries, optionally per framework; an entry is a callable or a lazy ``"module:attribute"`` string."""

    def __init__(self, kind: str, field: str) -> None:
        self.kind, self.field = kind, field
        self._entries: dict[tuple[str, str | None], Callable | str] = {}

    def add(self, name: str, target: Callable | str, framework: str | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.field}: {name!r} is not allowed; a {self.kind} name is a non-empty string")
        self._entries[(name, framework)] = target

    def register(self, name: str, framework: str | None = None) -> Callable[[Callable], Callable]:
        """Decorator form of :meth:`add`; returns the function unchanged."""

        def decorator(fn: Callable) -> Callable:
            self.add(name, fn, framework)
            return fn

        return decorator

    def names(self, framework: str | None = None) -> list[str]:
        return sorted(n for n, fw in self._entries if fw == framework)

    def check(self, name: str, framework: str | None = None) -> None:
        """Raise the field-named error unless ``name`` is registered (for ``framework``)."""
        if (name, framework) not in self._entries:
            where = f" for {framework}" if framework else ""
            raise RegistryError(f"{self.field}: {name!r} is not allowed{where}; choose one of: "
                                f"{', '.join(self.names(framework)) or '(none registered)'} "
                                f"(register your own with hvdsync.registry.register_{self.kind})")

    def get(self, name: str, framework: str | None = None) -> Callable:
        self.check(name, framework)
        target = self._entries[(name, framework)]
        if isinstance(target, str):
            module, attr = target.split(":")
            target = getattr(importlib.import_module(module), attr)
            self._entries[(name, framework)] = target
        return target


MODELS = Registry("model", "train.model")
DATASETS = Registry("dataset", "data.dataset")
CALLBACKS = Registry("callback", "train.callbacks")

# hvdsync's own entries (imported on first use). The TensorFlow adapter's are listed here too, for the same reason.
for _name, _framework, _target in (
    ("mlp", "torch", "hvdsync.torch.models:build_mlp"),
    ("cnn", "torch", "hvdsync.torch.models:build_cnn"),
    ("mlp", "tensorflow", "hvdsync.tensorflow.models:build_mlp"),
    ("cnn", "tensorflow", "hvdsync.tensorflow.models:build_cnn"),
):
    MODELS.add(_name, _target, _framework)
for _name, _target in (
    ("digits", "hvdsync.core.train.data:load_digits"),
    ("synthetic", "hvdsync.core.train.data:load_synthetic"),
    ("digits_images", "hvdsync.core.train.data:load_digits_images"),
    ("synthetic_images", "hvdsync.core.train.data:load_synthetic_images"),
):
    DATASETS.add(_name, _target)


def register_model(name: str, framework: str) -> Callable[[Callable], Callable]:
    """Register ``build(cfg, data) -> model`` as ``train.model: name`` for ``framework`` (``torch``/``tensorflow``).

    Example:
        >>> @register_model("tiny", framework="torch")          # doctest: +SKIP
        ... def tiny(cfg, data): return torch.nn.Linear(data.n_features, data.n_classes)
    """
    return MODELS.register(name, framework)


def register_dataset(name: str) -> Callable[[Callable], Callable]:
    """Register ``load(data_cfg, seed) -> hvdsync.core.train.data.Dataset`` as ``data.dataset: name``.

    Example:
        >>> @register_dataset("mine")                            # doctest: +SKIP
        ... def mine(data_cfg, seed): return Dataset(x_train, y_train, x_test, y_test, n_classes=10)
    """
    return DATASETS.register(name)


def register_callback(name: str) -> Callable[[Callable], Callable]:
    """Register ``make(cfg) -> hvdsync.core.train.callbacks.Callback`` (a ``Callback`` subclass taking the config will
    do) as a name for ``train.callbacks``: every worker's training loop then runs one, elastic runs included.

    Example:
        >>> @register_callback("step_logger")                     # doctest: +SKIP
        ... class StepLogger(Callback):
        ...     def __init__(self, cfg): self.every = 10
        ...     def on_step_end(self, ctx):
        ...         if ctx.rank == 0 and ctx.job_step % self.every == 0: print(ctx.job_step, ctx.metrics["loss"])
        >>> # then: --set train.plugins=[mypackage.callbacks] --set train.callbacks=[step_logger]
    """
    return CALLBACKS.register(name)


def make_callbacks(cfg: Any) -> list:
    """One of each callback ``cfg.train.callbacks`` names, made for ``cfg`` (in the worker, for its loop)."""
    return [CALLBACKS.get(name)(cfg) for name in cfg.train.callbacks]


def build_model(cfg: Any, data: Any, framework: str | None = None) -> Any:
    """The model ``cfg.train.model`` names, for ``framework`` (default ``cfg.train.framework``), sized for ``data``."""
    return MODELS.get(cfg.train.model, framework or cfg.train.framework)(cfg, data)


def load_dataset(data_cfg: Any, seed: int = 0) -> Any:
    """The data set ``data_cfg.dataset`` names, as a :class:`hvdsync.core.train.data.Dataset`."""
    return DATASETS.get(data_cfg.dataset)(data_cfg, seed)
