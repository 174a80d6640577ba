"""What the TensorFlow parallel tests run inside 2 Horovod workers (one launch, many checks; numbers come back).

Each ``check_*`` runs on every rank, makes the same collective calls in the same order on both, and returns plain
numbers/arrays; the references ("one process, plain Keras") are computed on rank 0 only, with no Horovod call.
tests/parallel/test_tensorflow.py sends this module to the workers by value (cloudpickle) and asserts on the numbers.
"""
from __future__ import annotations

import numpy as np

# Small synthetic problem for the exact-equality checks: big enough to move the weights, quick to trace.
FEATURES, CLASSES, HIDDEN, LR, SEED = 10, 3, 16, 0.5, 3


def _config(batch_size: int, **sync):
    from hvdsync.config import Config

    return Config.from_dict({"sync": sync, "data": {"batch_size": batch_size},
                             "train": {"hidden": HIDDEN, "lr": LR, "momentum": 0.0, "seed": SEED},
                             "tracking": {"enabled": False}})


def _dataset(n: int):
    from hvdsync.core.data import Dataset

    rng = np.random.default_rng([SEED, n])
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    return Dataset(x, y, x[:16], y[:16], CLASSES)


def _weights(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def reference(init: list[np.ndarray], data, plan, epochs: int) -> list[np.ndarray]:
    """One process, plain Keras, no Horovod: SGD on global batches of ``plan.global_batch`` samples taken in the
    plan's global order (the same samples the ranks share out), mean loss per batch (Keras' default)."""
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.SGD(LR), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for epoch in range(epochs):
        order = plan.order(epoch)
        for lo in range(0, len(order), plan.global_batch):
            idx = order[lo:lo + plan.global_batch]
            model.train_on_batch(data.x_train[idx], data.y_train[idx])
    return _weights(model)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.max(np.abs(x - y)) for x, y in zip(a, b)))


def check_fit(n: int, batch_size: int, accumulate: int, epochs: int, compression: str = "none") -> dict:
    """The shared loop with the TensorFlow backend vs the plain-Keras reference on the same samples."""
    import horovod.tensorflow as hvd

    from hvdsync.core.loop import fit_loop
    from hvdsync.core.sharding import ShardPlan
    from hvdsync.core.tracking import Tracker
    from hvdsync.tensorflow import build, init

    cfg = _config(batch_size=batch_size, accumulate=accumulate, compression=compression)
    cfg = cfg.replace(train={"epochs": epochs})
    init(cfg)
    data = _dataset(n)
    backend = build(cfg, data)
    start = _weights(backend.model)  # rank 0's, after the broadcast
    result = fit_loop(cfg, backend, data, tracker=Tracker())
    out = {"steps": result.optimizer_steps, "passes": result.backward_passes, "rounds": result.allreduce_rounds,
           "wire": result.wire, "spread": result.param_spread, "grad_tensors": backend.grad_tensors,
           "elements": sum(int(v.numpy().size) for v in backend.model.trainable_variables)}
    out["params"] = params = _weights(backend.model)
    if hvd.rank() == 0:
        plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
        ref = reference(start, data, plan, epochs)
        out.update(max_diff=_max_diff(params, ref), moved=_max_diff(params, start))
    return out


def check_apply_gradients(n: int = 64, batch_size: int = 8, accumulate: int = 4) -> dict:
    """The user-level API: a hand-written ``tf.function`` step calling ``apply_gradients`` once per micro-batch."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.core.scaling import loss_scale
    from hvdsync.core.sharding import ShardPlan
    from hvdsync.tensorflow import broadcast_state, distributed_optimizer, init, mlp

    cfg = _config(batch_size=batch_size, accumulate=accumulate)
    init(cfg)
    data = _dataset(n)
    model = mlp(FEATURES, HIDDEN, CLASSES)
    opt = distributed_optimizer(keras.optimizers.SGD(LR), model, cfg.sync)
    broadcast_state(model, opt)
    start = _weights(model)

    @tf.function
    def step(x, y, scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                                from_logits=True)) * scale
        return opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
    flags = []
    for s in plan.epoch(0, hvd.rank()):
        scale = tf.constant(loss_scale(s.global_count, hvd.size(), "average"), tf.float32)
        flags += [bool(step(data.x_train[m], data.y_train[m], scale)) for m in s.micro]
    out = {"flags": flags, "wire": opt.counter.snapshot(), "grad_tensors": len(model.trainable_variables),
           "traces": step.experimental_get_tracing_count()}
    if hvd.rank() == 0:
        out["max_diff"] = _max_diff(_weights(model), reference(start, data, plan, 1))
        out["moved"] = _max_diff(_weights(model), start)
    return out


def check_broadcast() -> dict:
    """Ranks with different weights and different optimizer state (Adam moments) end with rank 0's."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.core.monitor import fingerprint, spread
    from hvdsync.tensorflow import broadcast_state, mlp

    hvd.init()  # idempotent: each check also runs on its own
    rank = hvd.rank()
    model = mlp(FEATURES, HIDDEN, CLASSES)
    for v in model.trainable_variables:  # a different model on each rank
        v.assign(tf.random.stateless_normal(v.shape, seed=[rank, 7]))
    adam = keras.optimizers.Adam(0.01)
    adam.build(model.trainable_variables)
    adam.apply_gradients([(tf.fill(v.shape, float(rank + 1)), v) for v in model.trainable_variables])  # local step
    lazy = keras.optimizers.Adam(0.01)  # not built: broadcast_state must build it (its slots are created lazily)

    def state(opt):
        return [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]

    def gathered(opt):
        return hvd.allgather(tf.constant(fingerprint(state(opt))[None]), name="tf_checks.fingerprint").numpy()

    before = spread(gathered(adam))
    root = hvd.broadcast(tf.constant(fingerprint(state(adam))), root_rank=0, name="tf_checks.root").numpy()
    broadcast_state(model, adam)
    after = spread(gathered(adam))
    broadcast_state(model, lazy)
    return {"before": before, "after": after, "equals_root": bool(np.allclose(fingerprint(state(adam)), root)),
            "lazy_built": bool(lazy.built), "lazy_slots": len(lazy.variables), "lazy_after": spread(gathered(lazy))}


def check_sync_batch_norm() -> dict:
    """Each rank holds a different, uneven part (5 and 3 rows) of one batch; statistics, outputs and input
    gradients must equal plain batch normalisation of the whole batch in one process."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.tensorflow.layers import SyncBatchNormalization

    rng = np.random.default_rng(11)
    x = (rng.normal(size=(8, 4)) * [1.0, 2.0, 0.5, 3.0] + [0.0, 5.0, -1.0, 2.0]).astype(np.float32)
    w = rng.normal(size=(8, 4)).astype(np.float32)  # weights of a loss that makes the gradient non-trivial
    hvd.init()
    rows = [slice(0, 5), slice(5, 8)][hvd.rank()]

    def run(layer, xs, ws):
        xs = tf.constant(xs)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            out = layer(xs, training=True)
            loss = tf.reduce_sum(out * ws)
        return out.numpy(), tape.gradient(loss, xs).numpy(), layer.moving_mean.numpy(), layer.moving_variance.numpy()

    sync = SyncBatchNormalization(momentum=0.0)  # momentum 0: the moving statistics become the batch statistics
    eager = run(sync, x[rows], w[rows])
    traced = tf.function(lambda xs: sync(xs, training=True))(tf.constant(x[rows])).numpy()
    full = run(keras.layers.BatchNormalization(momentum=0.0), x, w)
    local = run(keras.layers.BatchNormalization(momentum=0.0), x[rows], w[rows])
    return {"out": _max_diff([eager[0]], [full[0][rows]]), "grad": _max_diff([eager[1]], [full[1][rows]]),
            "mean": _max_diff([eager[2]], [full[2]]), "var": _max_diff([eager[3]], [full[3]]),
            "mean_vs_numpy": float(np.max(np.abs(eager[2] - x.mean(0)))),
            "var_vs_numpy": float(np.max(np.abs(eager[3] - x.var(0)))),
            "traced": _max_diff([traced], [full[0][rows]]), "local_mean_off": _max_diff([local[2]], [full[2]])}


def check_loader(n: int = 101, batch_size: int = 8, accumulate: int = 3) -> dict:
    """The tf.data pipeline yields exactly the plan's micro-batches (uneven, even empty, on the last step)."""
    import horovod.tensorflow as hvd

    from hvdsync.core.sharding import ShardPlan
    from hvdsync.tensorflow import ShardedLoader

    hvd.init()
    data = _dataset(n)
    plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
    loader = ShardedLoader(data.x_train, data.y_train, plan, hvd.rank())
    loader.set_epoch(1)
    same, sizes = True, []
    for micro, step in loader:
        for (x, y), idx in zip(micro, step.micro):
            same &= bool(np.array_equal(x.numpy(), data.x_train[idx]) and np.array_equal(y.numpy(), data.y_train[idx]))
            sizes.append(int(x.shape[0]))
    counts = [int(c) for _, c in loader.dataset(1)]
    return {"same": same, "sizes": sizes, "steps": len(loader), "global_counts": counts}


def check_digits_fp16(epochs: int) -> dict:
    """``fit`` on digits with fp16 on the wire."""
    from hvdsync.config import Config
    from hvdsync.tensorflow import fit

    cfg = Config.from_dict({"sync": {"compression": "fp16"}, "train": {"framework": "tensorflow", "epochs": epochs},
                            "tracking": {"enabled": False}})
    r = fit(cfg)
    return {"accuracy": r.test_accuracy, "wire": r.wire, "steps": r.optimizer_steps, "rounds": r.allreduce_rounds,
            "spread": r.param_spread, "elements": 64 * cfg.train.hidden + cfg.train.hidden + cfg.train.hidden * 10 + 10,
            "phases": r.phase_seconds, "seconds": r.total_seconds}


def run_all(digits_epochs: int = 5) -> dict:
    """Every check, in one worker process per rank (TensorFlow's import is the slow part)."""
    import time

    timings, out = {}, {}
    checks = {
        "even": lambda: check_fit(96, 8, 1, 2),
        "accumulate": lambda: check_fit(96, 8, 4, 2),
        "uneven": lambda: check_fit(101, 8, 3, 2),
        "even_fp16": lambda: check_fit(96, 8, 1, 2, compression="fp16"),
        "apply_gradients": check_apply_gradients,
        "broadcast": check_broadcast,
        "sync_bn": check_sync_batch_norm,
        "loader": check_loader,
        "fp16": lambda: check_digits_fp16(digits_epochs),
    }
    for name, check in checks.items():
        t = time.perf_counter()
        out[name] = check()
        timings[name] = time.perf_counter() - t
    out["timings"] = timings
    return out
