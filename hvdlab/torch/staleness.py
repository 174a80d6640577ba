"""Asynchronous SGD with bounded staleness on a real PyTorch model, in one process: the delay queue and the
damping rules are :mod:`hvdlab.staleness`; this module only turns a model into the three callables
it takes (the gradient of a batch at a stale parameter version, the update, the copy).

Example::

    out = simulate(Config.from_dict({"train": {"lr": 0.5, "epochs": 3}}), taus=(0, 4, 16))
    out[("none", 16)]["accuracy"], out[("staleness", 16)]["accuracy"]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from hvdsync.datasets import Dataset, load
from hvdlab.staleness import run_async
from hvdsync.core.train._plan import ShardPlan
from hvdsync.registry import build_model


def _batches(data: Dataset, batch: int, epochs: int, seed: int) -> list[np.ndarray]:
    # One process reads the plan of a world of one: the same shuffled batches, in the same order, for every run.
    plan = ShardPlan(len(data.x_train), 1, batch, seed=seed)
    return [step.indices for epoch in range(epochs) for step in plan.epoch(epoch, 0)]


def simulate(cfg=None, taus: Sequence[int] = (0, 1, 2, 4, 8, 16), dampings: Sequence[str] = ("none", "staleness"),
             kind: str = "fixed", data: Dataset | None = None, model: torch.nn.Module | None = None,
             evaluate_every: int = 0) -> dict[tuple[str, int], dict]:
    """Train ``model`` (default: the registered ``train.model`` for ``data``, default digits) with plain SGD at
    ``train.lr`` over ``train.epochs`` of the same batches (``data.batch_size``), once per damping rule and
    staleness bound; ``tau = 0`` is synchronous SGD at the same samples.

    Args:
        cfg: a :class:`~hvdsync.config.Config` (model, data, lr, epochs, seed).
        taus: staleness bounds. dampings: keys of :data:`hvdlab.staleness.DAMPING`.
        kind: ``fixed`` (every gradient tau late) or ``uniform`` (0..tau).
        evaluate_every: also record the test accuracy every this many updates (0: only at the end).

    Returns ``{(damping, tau): {"accuracy", "curve": [(update, accuracy)], "staleness": mean staleness,
    "steps"}}``.
    """
    from hvdsync.config import Config  # here: hvdsync.config imports the core, not the adapters

    cfg = cfg or Config()
    data = data if data is not None else load(cfg.data, cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    model = model if model is not None else build_model(cfg, data, "torch")
    params = list(model.parameters())
    start = parameters_to_vector(params).detach().clone()
    x_train, y_train = torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train)
    x_test, y_test = torch.as_tensor(data.x_test, dtype=torch.float32), torch.as_tensor(data.y_test)
    batches = _batches(data, cfg.data.batch_size, cfg.train.epochs, cfg.train.seed)

    def grad(x: torch.Tensor, t: int) -> torch.Tensor:
        vector_to_parameters(x, params)      # the stale version the "worker" read
        model.zero_grad(set_to_none=False)
        idx = torch.as_tensor(batches[t])
        F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
        return torch.cat([p.grad.reshape(-1) for p in params]).clone()

    @torch.no_grad()
    def accuracy(x: torch.Tensor) -> float:
        vector_to_parameters(x, params)
        model.eval()
        try:
            return float((model(x_test).argmax(dim=1) == y_test).float().mean())
        finally:
            model.train()

    def on_step(t: int, x: torch.Tensor):
        return (t, accuracy(x)) if evaluate_every and t % evaluate_every == 0 else None

    out = {}
    threads = torch.get_num_threads()
    # One thread: a batch of 32 through a small MLP is too little work to split, and on a busy machine the idle
    # intra-op threads spin and wait (measured 40x slower with 2 threads on 2 loaded cores).
    torch.set_num_threads(1)
    try:
        for damping in dampings:
            for tau in taus:
                run = run_async(start.clone(), len(batches), grad, lambda x, g, lr: x - lr * g, cfg.train.lr, tau,
                                damping, kind, seed=cfg.train.seed, copy=torch.clone, on_step=on_step)
                out[(damping, tau)] = {"accuracy": accuracy(run.params), "curve": run.trace, "steps": len(batches),
                                       "staleness": float(np.mean(run.staleness))}
    finally:
        torch.set_num_threads(threads)
    return out
