"""Whole training runs of every sync mode in numpy, for any number of ranks (the 4- and 8-rank cases that 2 local
workers cannot show), on a softmax regression over the same shard plan the workers use.

Each simulated rank holds its own copy of the flat parameters and computes its gradient on its share of each
global step; the mode decides how the copies meet:

* ``allreduce``: every rank's gradient summed with the numpy ring (:func:`hvdlab.ring.ring_allreduce`),
  averaged, the same SGD step everywhere;
* ``ps``: :func:`hvdsync.core.comm.schemes.ps.ps_round` with ``servers`` shards, SGD at the owners;
* ``gossip``: every ``period`` steps :func:`hvdsync.core.comm.schemes.gossip.mix`, then a local SGD step.

Example:
    >>> data = blobs(600, 8, 3, seed=0)
    >>> ring_run = simulate("allreduce", data, world=4, steps=20)
    >>> ps_run = simulate("ps", data, world=4, steps=20, servers=1)
    >>> float(np.max(np.abs(ring_run.params[0] - ps_run.params[0]))) < 1e-12
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hvdlab import ring
from hvdsync.core.train.data import Dataset, synthetic
from hvdsync.core.comm.schemes import gossip, ps
from hvdsync.core.comm.schemes.ps import Traffic
from hvdsync.core.train._plan import ShardPlan


def blobs(samples: int, features: int, classes: int, seed: int = 0) -> Dataset:
    """A small synthetic classification set (see :func:`hvdsync.core.train.data.synthetic`)."""
    return synthetic(samples, features, classes, test_fraction=0.25, seed=seed)


def softmax_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray, n_classes: int, scale: float) -> np.ndarray:
    """Gradient of ``scale * sum of cross-entropy losses`` of a linear softmax model with flat weights ``w``
    (``features + 1`` rows: the last is the bias)."""
    weights = w.reshape(x.shape[1] + 1, n_classes)
    if len(x) == 0:
        return np.zeros_like(w)
    logits = x @ weights[:-1] + weights[-1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    grad = np.concatenate([x.T @ p, p.sum(axis=0, keepdims=True)]) * scale
    return grad.ravel()


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    weights = w.reshape(x.shape[1] + 1, n_classes)
    return float(np.mean(np.argmax(x @ weights[:-1] + weights[-1], axis=1) == y))


@dataclass
class SimRun:
    """What :func:`simulate` returns.

    Attributes:
        params: each rank's final flat parameters.
        consensus: consensus distance after every step (0 for the synchronous modes).
        traffic: bytes each rank sent and received over the run.
        accuracy: each rank's test accuracy at the end.
    """

    params: list[np.ndarray]
    consensus: list[float] = field(default_factory=list)
    traffic: Traffic | None = None
    accuracy: list[float] = field(default_factory=list)


def simulate(mode: str, data: Dataset, world: int, steps: int, lr: float = 0.5, batch: int = 16,
             servers: int = 0, period: int = 1, seed: int = 0, x0: np.ndarray | None = None,
             init_spread: float = 0.0) -> SimRun:
    """Run ``steps`` SGD steps of ``mode`` with ``world`` simulated ranks over the shard plan of ``data``.

    Args:
        mode: ``allreduce``, ``ps`` or ``gossip``.
        data: the dataset (all ranks see the same arrays; the plan picks each rank's samples).
        world: number of simulated ranks.
        steps: optimizer steps (the plan's epochs are walked in order).
        lr: SGD learning rate. batch: samples per rank per step.
        servers: ``sync.ps_servers`` for ``ps``. period: gossip every ``period`` steps.
        x0: initial flat parameters (default: small seeded noise), the same on every rank.
        init_spread: standard deviation of per-rank noise added to ``x0`` (ranks that start apart, to watch
            gossip pull them together).
    """
    n_classes, features = data.n_classes, data.n_features
    size = (features + 1) * n_classes
    start = x0 if x0 is not None else np.random.default_rng(seed).normal(0, 0.01, size)
    noise = np.random.default_rng([seed, 1]).normal(0, init_spread, (world, size)) if init_spread else np.zeros((world, size))
    xs = [np.array(start, dtype=np.float64) + noise[r] for r in range(world)]
    plan = ShardPlan(len(data.x_train), world, batch, seed=seed)
    total = Traffic(np.zeros(world, dtype=np.int64), np.zeros(world, dtype=np.int64))
    consensus: list[float] = []
    done, epoch = 0, 0
    while done < steps:
        for parts in zip(*(plan.epoch(epoch, r) for r in range(world))):
            if done == steps:
                break
            g_count = parts[0].global_count

            def grad(r: int, x: np.ndarray, parts=parts, g_count=g_count) -> np.ndarray:  # bound: this step's
                idx = parts[r].indices
                # Summed loss times W/G: the local mean (the loss scale the adapters use with op 'average').
                return softmax_grad(x, data.x_train[idx], data.y_train[idx], n_classes, world / g_count)

            if mode == "allreduce":
                trace = ring.ring_allreduce([grad(r, xs[r]) for r in range(world)])
                xs = [x - lr * summed / world for x, summed in zip(xs, trace.results)]
                nbytes = ring.ring_bytes_per_rank(world, size * 8)
                total = total + Traffic(np.full(world, int(nbytes)), np.full(world, int(nbytes)))
            elif mode == "ps":
                xs, t = ps.ps_round([grad(r, xs[r]) for r in range(world)], xs[0], servers,
                                    lambda _server, p, g: p - lr * g)
                total = total + t
            elif mode == "gossip":
                if done % period == 0:
                    xs = gossip.mix(xs)
                    total = total + gossip.traffic(size, 8, world)
                xs = [x - lr * grad(r, x) for r, x in enumerate(xs)]
            else:
                raise ValueError(f"mode: {mode!r} is not allowed; choose one of: allreduce, ps, gossip")
            consensus.append(gossip.consensus_distance(xs))
            done += 1
        epoch += 1
    acc = [accuracy(x, data.x_test, data.y_test, n_classes) for x in xs]
    return SimRun(xs, consensus, total, acc)
