"""Sync modes beyond lock-step all-reduce: what each one is, which settings it accepts, and its maths in numpy.

``sync.mode`` names one of :data:`MODES`. The config asks :meth:`Mode.problem` before any worker starts, so an
impossible combination (a parameter server with Adasum, gossip with a gradient codec, a mode the framework's
adapter does not implement) fails with one message naming the field. The framework-free maths and the numpy
simulations live in the submodules (:mod:`.ps`, :mod:`.gossip`, :mod:`.local_sgd`, :mod:`.staleness`); the
adapters (``hvdsync/torch/schemes/``, ``hvdsync/tensorflow/schemes/``) only move tensors through Horovod's
collectives as those modules plan.

Example:
    >>> MODES["ps"].problem({"op": "adasum", "compression": "none", "period": 1, "ps_servers": 0}, "torch", 2)
    "sync.op: 'adasum' is not allowed with sync.mode 'ps'; choose one of: average, sum"
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Mode:
    """One value of ``sync.mode``.

    Attributes:
        name: the config value.
        summary: one line for errors and docs.
        frameworks: adapters that implement it.
        ops: the ``sync.op`` values it accepts.
        codecs: the ``sync.compression`` values it accepts (``None``: any).
        periodic: whether it accepts ``sync.period`` > 1 (communicate every H steps).
        servers: whether it accepts ``sync.ps_servers``.
        warmup: whether it accepts ``sync.warmup_steps`` (synchronous steps first: post-local SGD).
        lockstep: whether every rank holds the same parameters after every step (the monitor's divergence check).
        elastic: the frameworks whose elastic state carries this mode's optimizer state (``None``: all of
            ``frameworks``).
    """

    name: str
    summary: str
    frameworks: tuple[str, ...]
    ops: tuple[str, ...]
    codecs: tuple[str, ...] | None
    periodic: bool = False
    servers: bool = False
    warmup: bool = False
    lockstep: bool = True
    elastic: tuple[str, ...] | None = None

    def problem(self, sync: Mapping[str, Any], framework: str, world_size: int, precision: str = "fp32",
                elastic: bool = False) -> str | None:
        """The first reason these settings cannot run in this mode, as a field-named message, or None
        (``elastic``: ``elastic.enabled``)."""
        if self.name != "allreduce" and precision != "fp32":
            # The loss scaler unscales the gradients in .grad after synchronize(); a parameter server has already
            # pushed the scaled ones by then, so the update would be off by the loss scale.
            return (f"train.precision: {precision!r} is not allowed with sync.mode {self.name!r}; expected fp32 "
                    f"(mixed precision is implemented for sync.mode 'allreduce')")
        if framework not in self.frameworks:
            return (f"sync.mode: {self.name!r} is not allowed with train.framework {framework!r}; "
                    f"it is implemented for: {', '.join(self.frameworks)}")
        if elastic and self.elastic is not None and framework not in self.elastic:
            return (f"sync.mode: {self.name!r} is not allowed with elastic training in train.framework "
                    f"{framework!r}; its sharded optimizer state is carried across resets for: "
                    f"{', '.join(self.elastic)} (or set elastic.enabled false)")
        if sync["op"] not in self.ops:
            return f"sync.op: {sync['op']!r} is not allowed with sync.mode {self.name!r}; choose one of: " + ", ".join(self.ops)
        if self.codecs is not None and sync["compression"] not in self.codecs:
            return (f"sync.compression: {sync['compression']!r} is not allowed with sync.mode {self.name!r}; "
                    f"choose one of: " + ", ".join(self.codecs))
        if not self.periodic and sync["period"] != 1:
            return (f"sync.period: {sync['period']!r} is not allowed with sync.mode {self.name!r}; it synchronises "
                    f"every step (expected 1); modes that communicate every H steps: "
                    + ", ".join(m.name for m in MODES.values() if m.periodic))
        if not self.servers and sync["ps_servers"] != 0:
            return (f"sync.ps_servers: {sync['ps_servers']!r} is not allowed with sync.mode {self.name!r}; "
                    f"expected 0 (only sync.mode 'ps' has servers)")
        if self.servers and sync["ps_servers"] > world_size:
            return (f"sync.ps_servers: {sync['ps_servers']!r} is not allowed with train.np {world_size}; expected "
                    f"0 (one shard per rank) or 1 to {world_size}")
        if not self.warmup and sync.get("warmup_steps", 0) != 0:
            return (f"sync.warmup_steps: {sync['warmup_steps']!r} is not allowed with sync.mode {self.name!r}; "
                    f"expected 0 (synchronous steps first is post-local SGD: sync.mode 'local_sgd')")
        return None


MODES: dict[str, Mode] = {
    "allreduce": Mode("allreduce", "ring all-reduce of the gradients, Horovod's DistributedOptimizer",
                      ("torch", "tensorflow"), ("average", "sum", "adasum"), None),
    "ps": Mode("ps", "parameter server built from Horovod collectives: gradients pushed to the shard owners, "
                     "updated there, parameters pulled back", ("torch", "tensorflow"), ("average", "sum"),
               ("none", "fp16"), servers=True, elastic=("torch",)),
    "gossip": Mode("gossip", "decentralised averaging: each rank mixes its parameters with its ring neighbours "
                             "(a parameter exchange, not a gradient codec)", ("torch", "tensorflow"), ("average",),
                   ("none",), periodic=True, lockstep=False),
    # Parameters, not gradients, are averaged: a gradient codec has nothing to act on, and a sum of parameters is
    # no model. Accumulation is fine: it sums micro-batches inside one step, and steps are what the period counts.
    "local_sgd": Mode("local_sgd", "local SGD: every rank steps on its own gradients and the parameters (with the "
                                   "optimizer state) are averaged every sync.period steps",
                      ("torch", "tensorflow"), ("average",), ("none",), periodic=True, warmup=True,
                      lockstep=False),
}
