"""What tests/parallel/test_accumulation.py runs inside 2 Horovod workers: the same loop of a user's own, written once
per framework, with ``accumulate=2``, from the same initial weights on the same global batches.

The loop follows the one accumulation rule (hvdsync.adapter.ACCUMULATION_RULE): each micro-batch's summed loss times
``loss_scale`` of the global step, one backward pass per micro-batch, one update per step; the optimizer applies the
sum of the passes. Each worker returns its final parameters (Keras' layout: kernels ``(in, out)``) and, on rank 0,
the references: one process without Horovod on the global batches at the learning rate, and at half of it (what
averaging the two passes instead of summing them would apply).
"""
from __future__ import annotations

import numpy as np

FEATURES, HIDDEN, CLASSES = 10, 16, 3
N, BATCH, ACCUMULATE, EPOCHS, LR, SEED = 64, 8, 2, 2, 0.5, 11


def _problem() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The data and the initial weights, identical in both frameworks (Keras' layout)."""
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(N, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=N).astype(np.int64)
    init = [rng.normal(scale=0.3, size=(FEATURES, HIDDEN)), np.zeros(HIDDEN),
            rng.normal(scale=0.3, size=(HIDDEN, CLASSES)), np.zeros(CLASSES)]
    return x, y, [w.astype(np.float32) for w in init]


def _plan(world_size: int):
    from hvdsync.core.train._plan import ShardPlan

    return ShardPlan(N, world_size, BATCH, ACCUMULATE, SEED, True)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.max(np.abs(np.asarray(p) - np.asarray(q))) for p, q in zip(a, b)))


# ---- PyTorch ----------------------------------------------------------------------------------------------------
def _torch_model(init: list[np.ndarray]):
    import torch

    import hvdsync.torch as hs

    model = hs.mlp(FEATURES, HIDDEN, CLASSES)
    with torch.no_grad():
        for p, w in zip(model.parameters(), init):
            p.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))  # torch's Linear holds (out, in)
    return model


def _torch_weights(model) -> list[np.ndarray]:
    return [p.detach().numpy().T.copy() if p.dim() == 2 else p.detach().numpy().copy() for p in model.parameters()]


def torch_loops() -> dict:
    """The loop on PyTorch, through both of hvdsync's cast paths: one grouped all-reduce after backward
    (``grouped_mb`` 25, this small model's default) and Horovod's hooks (``grouped_mb`` 0, where Horovod's
    ``backward_passes_per_step`` counts the passes)."""
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import hvdsync.torch as hs
    from hvdlab.torch.reference import global_batches, sequential_sgd
    from hvdsync.config import SyncConfig
    from hvdsync.core.train._scaling import loss_scale

    hs.init()
    x, y, init = _problem()
    plan = _plan(hvd.size())
    out: dict = {"rank": hvd.rank()}
    for path, grouped_mb in (("grouped", 25.0), ("hooks", 0.0)):
        model = _torch_model(init)
        opt = hs.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=LR), model,
                                       SyncConfig(grouped_mb=grouped_mb), accumulate=ACCUMULATE)
        hs.broadcast_state(model, opt)
        for epoch in range(EPOCHS):
            for step in plan.epoch(epoch, hvd.rank()):
                opt.zero_grad()
                for idx in step.micro:  # the loss of the rule: summed, times the global step's scale
                    loss = F.cross_entropy(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx]), reduction="sum")
                    (loss * loss_scale(step.global_count, hvd.size(), "average")).backward()
                opt.step()
        out[path] = _torch_weights(model)
    if hvd.rank() == 0:
        for name, lr in (("reference", LR), ("halved", LR / 2)):
            model = _torch_model(init)
            sequential_sgd(model, x, y, global_batches(plan, epochs=EPOCHS), lr=lr)
            out[name] = _torch_weights(model)
    out["init"] = init
    return out


# ---- TensorFlow -------------------------------------------------------------------------------------------------
def _keras_reference(init: list[np.ndarray], x: np.ndarray, y: np.ndarray, plan, lr: float) -> list[np.ndarray]:
    """One process, plain Keras SGD, no Horovod: the batch-mean loss on each global batch."""
    import keras

    import hvdsync.tensorflow as hs

    model = hs.mlp(FEATURES, HIDDEN, CLASSES)
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.SGD(lr), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for epoch in range(EPOCHS):
        order = plan.order(epoch)
        for lo in range(0, N, plan.global_batch):
            model.train_on_batch(x[order[lo:lo + plan.global_batch]], y[order[lo:lo + plan.global_batch]])
    return [np.array(v.numpy()) for v in model.trainable_variables]


def tensorflow_loop() -> dict:
    """The loop on TensorFlow: a ``tf.function`` step calling ``apply_gradients`` once per micro-batch; every
    second call all-reduces and updates."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvdsync.tensorflow as hs
    from hvdsync.core.train._scaling import loss_scale

    hs.init()
    x, y, init = _problem()
    plan = _plan(hvd.size())
    model = hs.mlp(FEATURES, HIDDEN, CLASSES)
    model.set_weights(init)
    opt = hs.distributed_optimizer(keras.optimizers.SGD(LR), model, accumulate=ACCUMULATE)
    hs.broadcast_state(model, opt)

    @tf.function
    def backward(xb, yb, scale):
        with tf.GradientTape() as tape:  # the loss of the rule: summed, times the global step's scale
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(yb, model(xb, training=True),
                                                                                from_logits=True)) * scale
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    for epoch in range(EPOCHS):
        for step in plan.epoch(epoch, hvd.rank()):
            scale = tf.constant(loss_scale(step.global_count, hvd.size(), "average"), tf.float32)
            for idx in step.micro:
                backward(x[idx], y[idx], scale)
    out: dict = {"rank": hvd.rank(), "params": [np.array(v.numpy()) for v in model.trainable_variables],
                 "updates": int(opt.iterations.numpy()), "init": init}
    if hvd.rank() == 0:
        out["reference"] = _keras_reference(init, x, y, plan, LR)
        out["halved"] = _keras_reference(init, x, y, plan, LR / 2)
    return out
