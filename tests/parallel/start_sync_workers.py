"""Workers for test_start_sync.py: replicas built with *different* initial weights on each rank, trained with
hvdsync's distributed optimizer with and without an explicit broadcast (torch: a loop; Keras 3: compile/fit with the
PlanSampler callback). Each returns its first and final weights (and, for torch, how many times the weights were
broadcast)."""
from __future__ import annotations

import copy

import numpy as np

STEPS = 6


class _Counted:
    """Counts the calls of one Horovod function (the fault-free way to see that a broadcast happened, and once)."""

    def __init__(self, module, name: str) -> None:
        self.module, self.name, self.calls = module, name, 0
        self.original = getattr(module, name)
        setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.original(*args, **kwargs)

    def close(self) -> int:
        setattr(self.module, self.name, self.original)
        return self.calls


def _data(rank: int, n: int, features: int = 8, classes: int = 3):
    rng = np.random.default_rng(1000 + rank)  # each rank its own shard
    return rng.normal(size=(n, features)).astype("float32"), rng.integers(0, classes, n)


def torch_runs() -> dict:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import hvdsync.torch as hs
    from hvdsync.torch.optimizer import mark_broadcast_done

    hvd.init()
    torch.set_num_threads(1)
    x, y = _data(hvd.rank(), 16 * STEPS)
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    def run(how: str) -> dict:
        torch.manual_seed(100 + hvd.rank())  # a different start on every rank
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        start = [p.detach().numpy().copy() for p in model.parameters()]
        counted = _Counted(hvd, "broadcast_parameters")
        opt = hs.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       None if how == "no model" else model)
        if how == "implicit":  # a copy of the model before training (a weight average) takes no optimizer along
            twin = copy.deepcopy(model)
            twin(x[:4]).sum().backward()  # a training forward of the copy: no broadcast
        if how == "explicit":
            hs.broadcast_state(model, opt)
        elif how == "flag only":  # the control: the flag set without a broadcast, so the ranks stay apart
            mark_broadcast_done(model, opt)
        model.eval()
        with torch.no_grad():
            model(x[:4])  # an evaluation forward (it may run on one rank only): no broadcast there
        model.train()
        for i in range(STEPS):
            opt.zero_grad()
            F.cross_entropy(model(x[16 * i:16 * (i + 1)]), y[16 * i:16 * (i + 1)]).backward()
            opt.step()
        return {"start": start, "end": [p.detach().numpy().copy() for p in model.parameters()],
                "broadcasts": counted.close()}

    return {how: run(how) for how in ("implicit", "explicit", "no model", "flag only")}


def keras_runs() -> dict:
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvdsync.tensorflow as hs

    hvd.init()
    x, y = _data(hvd.rank(), 16 * STEPS)
    images, labels = tf.constant(x), tf.constant(y)

    def run(how: str) -> dict:
        keras.utils.set_random_seed(100 + hvd.rank())  # a different start on every rank
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        start = [v.numpy().copy() for v in model.trainable_variables]
        optimizer = hs.distributed_optimizer(keras.optimizers.SGD(0.1, momentum=0.9))
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        sampler = hs.PlanSampler(len(x), 16, seed=0)
        stream = sampler.dataset(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
        callbacks = [sampler]
        if how == "callback":
            callbacks.append(hs.callbacks.BroadcastGlobalVariablesCallback(0))
        elif how == "flag only":  # the control: the flag set without a broadcast, so the ranks stay apart
            optimizer.broadcast_done = True
        model.fit(stream, epochs=2, callbacks=callbacks, shuffle=False, verbose=0)
        end = [v.numpy().copy() for v in model.trainable_variables]
        # Once: rank 1 moved away after training stays away through one more epoch (no second broadcast).
        if hvd.rank() == 1:
            model.trainable_variables[0].assign_add(tf.ones_like(model.trainable_variables[0]))
        model.fit(stream, epochs=1, callbacks=[sampler], shuffle=False, verbose=0)
        return {"start": start, "end": end, "later": [v.numpy().copy() for v in model.trainable_variables]}

    return {how: run(how) for how in ("implicit", "callback", "flag only")}
