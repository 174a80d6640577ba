"""Co-design with the model (notebook 17), PyTorch: measurements that run inside Horovod workers.

* :func:`embedding_exchange`: an embedding table with sparse gradients trained with ``sync.sparse`` allgather and
  dense side by side: bytes counted, reduced gradients and parameters compared.
* :func:`batchnorm_comparison`: local batch norm against :class:`~hvdsync.torch.SyncBatchNormalization` at small
  per-rank batches, through :func:`hvdsync.torch.fit` with the user's own model.
* The model split (pipeline stages, data parallel across pairs) is in :mod:`hvdlab.torch.split`.
"""
from __future__ import annotations

import time

import horovod.torch as hvd
import numpy as np
import torch
from torch import nn

from hvdlab import embedding
from hvdsync.core.comm.codecs import WireCounter


class EmbeddingRegressor(nn.Module):
    """A sample is ``BAG`` ids; its embedding is the mean of their rows; a linear layer reads it."""

    def __init__(self, table_rows: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(table_rows, dim, sparse=True)
        self.head = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).mean(dim=1)).squeeze(1)


def _spread(tensors: list[torch.Tensor]) -> float:
    """Largest difference of any parameter between this rank and rank 0 (the same value on every rank)."""
    worst = max(float((t - hvd.broadcast(t, root_rank=0, name=f"codesign.spread.{i}")).abs().max())
                for i, t in enumerate(tensors))
    return float(hvd.allreduce(torch.tensor([worst]), op=hvd.Max, name="codesign.spread").item())


def embedding_exchange(table_rows: int = 100_000, dim: int = 16, lookups: int = 300, steps: int = 5,
                       compression: str = "none", lr: float = 0.5, seed: int = 0,
                       modes: tuple[str, ...] = ("allgather", "dense")) -> dict:
    """Train :class:`EmbeddingRegressor` for ``steps`` with each ``sync.sparse`` mode of ``modes``, from the same
    start on the same lookups (``lookups`` ids per rank per step: :func:`hvdlab.embedding.draw_lookups`).

    Returns (every rank): per mode the counted bytes, dtypes and seconds per step, the parameters' spread across
    ranks; the largest difference between the modes' reduced table gradients (every step) and final parameters;
    the distinct rows per step and :func:`hvdlab.embedding.exchange_formula`'s bytes.
    """
    hvd.init()
    rank = hvd.rank()
    batches = [torch.from_numpy(embedding.draw_lookups(table_rows, lookups, s, rank, seed)) for s in range(steps)]
    targets = [torch.from_numpy(np.random.default_rng([seed, s, rank, 1]).normal(size=len(b)).astype(np.float32))
               for s, b in enumerate(batches)]
    out: dict = {"rank": rank, "size": hvd.size(), "modes": {},
                 "distinct_rows": [int(np.unique(b.numpy()).size) for b in batches]}
    grads, params = {}, {}
    for mode in modes:
        torch.manual_seed(seed)
        model = EmbeddingRegressor(table_rows, dim)
        counter = WireCounter()
        from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer

        opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=lr), model, compression=compression,
                                    sparse=mode, counter=counter)
        broadcast_state(model, opt)
        grads[mode] = []
        start = time.perf_counter()
        for ids, y in zip(batches, targets):
            opt.zero_grad()
            nn.functional.mse_loss(model(ids), y).backward()
            opt.synchronize()
            grads[mode].append(model.table.weight.grad.to_dense().clone())
            with opt.skip_synchronize():
                opt.step()
        seconds = (time.perf_counter() - start) / steps
        params[mode] = [p.detach().clone() for p in model.parameters()]
        out["modes"][mode] = {**counter.snapshot(), "seconds_per_step": seconds, "spread": _spread(params[mode])}
    if len(modes) == 2:  # the reduced gradients and the parameters the two ways reach
        out["grad_difference"] = max(float((a - b).abs().max()) for a, b in zip(grads["allgather"], grads["dense"]))
        out["param_difference"] = max(float((a - b).abs().max()) for a, b in zip(params["allgather"], params["dense"]))
        out["grad_scale"] = max(float(g.abs().max()) for g in grads["dense"])
    value_bytes = 2 if compression == "fp16" else 4
    out["formula"] = embedding.exchange_formula(out["distinct_rows"], table_rows, dim, dim + 1, value_bytes)
    return out


def bn_mlp(features: int, hidden: int, classes: int, synchronised: bool) -> nn.Module:
    """Linear, batch norm (hvdsync's synchronised one, or ``nn.BatchNorm1d``), ReLU, Linear."""
    from hvdsync.torch.layers import SyncBatchNormalization

    norm = SyncBatchNormalization(hidden) if synchronised else nn.BatchNorm1d(hidden)
    return nn.Sequential(nn.Linear(features, hidden), norm, nn.ReLU(), nn.Linear(hidden, classes))


def batchnorm_statistics(rows: tuple[int, ...] = (5, 3), channels: int = 4, seed: int = 0) -> dict:
    """One training-mode forward of a batch split unevenly over ranks (``rows[r]`` samples on rank ``r``) through
    ``nn.BatchNorm1d`` and :class:`~hvdsync.torch.SyncBatchNormalization` (momentum 1: the running statistics are
    the batch's). Returns, for this rank, both layers' mean and variance and those of the whole global batch."""
    from hvdsync.torch.layers import SyncBatchNormalization

    hvd.init()
    rank = hvd.rank()
    x = torch.from_numpy(np.random.default_rng([seed, rank]).normal(2.0, 3.0, (rows[rank], channels))
                         .astype(np.float32))
    everything = hvd.allgather(x, name="codesign.bn.batch").double()
    out = {"rank": rank, "global_mean": everything.mean(0).tolist(),
           "global_var": everything.var(0, unbiased=True).tolist()}
    for name, layer in (("local", nn.BatchNorm1d(channels, momentum=1.0)),
                        ("sync", SyncBatchNormalization(channels, momentum=1.0))):
        layer.train()
        layer(x)
        out[name] = {"mean": layer.running_mean.tolist(), "var": layer.running_var.tolist()}
    return out


def batchnorm_comparison(batch_sizes: tuple[int, ...] = (2, 4, 16), epochs: int = 2, hidden: int = 64,
                         lr: float = 0.05, seed: int = 0, test_fraction: float = 0.25) -> list[dict]:
    """Train :func:`bn_mlp` on digits with local and with synchronised batch norm, per per-rank batch size, through
    :func:`hvdsync.torch.fit` (the user's-own-model path); the same samples, seed and steps for both.

    The training set is cut to a multiple of every global batch, so no rank gets a one-sample last batch (which
    ``nn.BatchNorm1d`` refuses in training). Returns one row per (batch size, kind) with the test accuracy (each rank
    evaluates its share with its own running statistics; the accuracy is over all ranks' shares) and seconds.
    ``test_fraction`` of digits is held out for the accuracy; the rest trains (a larger one: fewer steps, quicker).
    """
    from hvdsync import datasets
    from hvdlab.codesign import compare_local_and_sync
    from hvdsync.core.train.batchnorm import whole_batches
    from hvdsync.torch.train import fit

    hvd.init()
    data = whole_batches(datasets.digits(test_fraction, seed), hvd.size(), batch_sizes)

    def train(cfg, synchronised: bool):
        torch.manual_seed(seed)
        model = bn_mlp(data.x_train.shape[1], hidden, data.n_classes, synchronised)
        return fit(cfg, data, model=model, loss=nn.CrossEntropyLoss())

    return compare_local_and_sync("torch", data, hvd.size(), batch_sizes, epochs, lr, seed, train)
