"""Co-design with the model (notebook 17), TensorFlow: measurements that run inside Horovod workers.

Mirrors :mod:`hvdlab.torch.codesign`: :func:`embedding_exchange` (``IndexedSlices`` from a Keras ``Embedding``
with ``sync.sparse`` allgather and dense side by side) and :func:`batchnorm_comparison` (local against
synchronised batch norm at small per-rank batches).
"""
from __future__ import annotations

import time

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdlab import embedding
from hvdsync.core.comm.codecs import WireCounter


def embedding_model(table_rows: int, dim: int) -> keras.Model:
    """A sample is ``BAG`` ids; its embedding is the mean of their rows; a dense layer reads it."""
    return keras.Sequential([keras.Input((embedding.BAG,), dtype="int64"), keras.layers.Embedding(table_rows, dim),
                             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])


def _spread(variables) -> float:
    """Largest difference of any variable between this rank and rank 0 (the same value on every rank)."""
    worst = max(float(tf.reduce_max(tf.abs(v - hvd.broadcast(v, root_rank=0, name=f"codesign_spread_{i}"))))
                for i, v in enumerate(variables))
    return float(hvd.allreduce(tf.constant([worst]), op=hvd.Max, name="codesign_spread")[0])


def embedding_exchange(table_rows: int = 100_000, dim: int = 16, lookups: int = 300, steps: int = 5,
                       compression: str = "none", lr: float = 0.5, seed: int = 0,
                       modes: tuple[str, ...] = ("allgather", "dense")) -> dict:
    """The same measurement as :func:`hvdlab.torch.codesign.embedding_exchange`, with a Keras ``Embedding``."""
    from hvdsync.tensorflow.optimizer import broadcast_state, distributed_optimizer

    hvd.init()
    rank = hvd.rank()
    batches = [embedding.draw_lookups(table_rows, lookups, s, rank, seed) for s in range(steps)]
    targets = [np.random.default_rng([seed, s, rank, 1]).normal(size=len(b)).astype(np.float32)
               for s, b in enumerate(batches)]
    out: dict = {"rank": rank, "size": hvd.size(), "modes": {},
                 "distinct_rows": [int(np.unique(b).size) for b in batches]}
    grads, params = {}, {}
    for mode in modes:
        keras.utils.set_random_seed(seed)
        model = embedding_model(table_rows, dim)
        counter = WireCounter()
        opt = distributed_optimizer(keras.optimizers.SGD(lr), model, compression=compression, sparse=mode,
                                    counter=counter)
        broadcast_state(model, opt)
        grads[mode], kinds = [], set()
        start = time.perf_counter()
        for ids, y in zip(batches, targets):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ids, training=True)[:, 0] - y))
            g = tape.gradient(loss, model.trainable_variables)
            kinds.add(type(g[0]).__name__)
            opt.accumulate(g)
            opt.synchronize()
            grads[mode].append(tf.identity(opt._grad_sums[0].value))  # the reduced table gradient
            opt.step()
        seconds = (time.perf_counter() - start) / steps
        params[mode] = [tf.identity(v.value) for v in model.trainable_variables]
        out["modes"][mode] = {**counter.snapshot(), "seconds_per_step": seconds, "spread": _spread(params[mode]),
                              "gradient_types": sorted(kinds)}
    if len(modes) == 2:  # the reduced gradients and the parameters the two ways reach
        out["grad_difference"] = max(float(tf.reduce_max(tf.abs(a - b)))
                                     for a, b in zip(grads["allgather"], grads["dense"]))
        out["param_difference"] = max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(params["allgather"],
                                                                                          params["dense"]))
        out["grad_scale"] = max(float(tf.reduce_max(tf.abs(g))) for g in grads["dense"])
    value_bytes = 2 if compression == "fp16" else 4
    out["formula"] = embedding.exchange_formula(out["distinct_rows"], table_rows, dim, dim + 1, value_bytes)
    return out


def bn_mlp(features: int, hidden: int, classes: int, synchronised: bool) -> keras.Model:
    """Dense, batch norm (hvdsync's synchronised one, or Keras'), ReLU, Dense (logits)."""
    from hvdsync.tensorflow.layers import SyncBatchNormalization

    # Momentum 0.9 (PyTorch's 0.1): Keras' default 0.99 leaves the moving statistics near their start after the
    # few dozen steps of a large-batch run, which would blur the comparison.
    norm = SyncBatchNormalization(momentum=0.9) if synchronised else keras.layers.BatchNormalization(momentum=0.9)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(hidden), norm, keras.layers.ReLU(),
                             keras.layers.Dense(classes)])


def batchnorm_statistics(rows: tuple[int, ...] = (5, 3), channels: int = 4, seed: int = 0) -> dict:
    """The same as :func:`hvdlab.torch.codesign.batchnorm_statistics` with Keras' layer and hvdsync's (momentum 0:
    the moving statistics are the batch's; Keras keeps the biased variance)."""
    from hvdsync.tensorflow.layers import SyncBatchNormalization

    hvd.init()
    rank = hvd.rank()
    x = np.random.default_rng([seed, rank]).normal(2.0, 3.0, (rows[rank], channels)).astype(np.float32)
    everything = hvd.allgather(tf.constant(x), name="codesign_bn_batch").numpy().astype(np.float64)
    out = {"rank": rank, "global_mean": everything.mean(0).tolist(), "global_var": everything.var(0).tolist()}
    for name, layer in (("local", keras.layers.BatchNormalization(momentum=0.0)),
                        ("sync", SyncBatchNormalization(momentum=0.0))):
        layer(x, training=True)
        out[name] = {"mean": layer.moving_mean.numpy().tolist(), "var": layer.moving_variance.numpy().tolist()}
    return out


def batchnorm_comparison(batch_sizes: tuple[int, ...] = (2, 4, 16), epochs: int = 2, hidden: int = 64,
                         lr: float = 0.05, seed: int = 0, test_fraction: float = 0.25) -> list[dict]:
    """The same as :func:`hvdlab.torch.codesign.batchnorm_comparison`, through :func:`hvdsync.tensorflow.fit`."""
    from hvdsync import datasets
    from hvdlab.codesign import compare_local_and_sync
    from hvdsync.core.train.batchnorm import whole_batches
    from hvdsync.tensorflow.train import fit

    hvd.init()
    data = whole_batches(datasets.digits(test_fraction, seed), hvd.size(), batch_sizes)

    def train(cfg, synchronised: bool):
        keras.utils.set_random_seed(seed)
        model = bn_mlp(data.x_train.shape[1], hidden, data.n_classes, synchronised)
        return fit(cfg, data, model=model, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    return compare_local_and_sync("tensorflow", data, hvd.size(), batch_sizes, epochs, lr, seed, train)
